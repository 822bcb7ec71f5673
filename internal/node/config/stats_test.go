package config_test

import (
	"strings"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel-go/internal/node/config"
)

// TestStatsSettings: STATS_TLS_CERT and STATS_TLS_KEY come together (one
// alone is refused, naming both), and METRICS_DELETED_WORKLOAD_GRACE
// defaults to five minutes, takes a duration or seconds, and 0.
func TestStatsSettings(t *testing.T) {
	c, err := config.Parse(env(map[string]string{"NODE_NAME": "n1"}), nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.StatsTLSCert != "" || c.StatsTLSKey != "" || c.MetricsGrace != 5*time.Minute {
		t.Fatalf("defaults: cert %q key %q grace %v", c.StatsTLSCert, c.StatsTLSKey, c.MetricsGrace)
	}
	c, err = config.Parse(env(map[string]string{"NODE_NAME": "n1", "STATS_TLS_CERT": "/c", "STATS_TLS_KEY": "/k",
		"METRICS_DELETED_WORKLOAD_GRACE": "90"}), nil)
	if err != nil || c.StatsTLSCert != "/c" || c.StatsTLSKey != "/k" || c.MetricsGrace != 90*time.Second {
		t.Fatalf("set: %+v, %v", c, err)
	}
	if c, err = config.Parse(env(map[string]string{"NODE_NAME": "n1", "METRICS_DELETED_WORKLOAD_GRACE": "0"}), nil); err != nil || c.MetricsGrace != 0 {
		t.Fatalf("grace 0: %v, %v", c.MetricsGrace, err)
	}
	for _, m := range []map[string]string{{"STATS_TLS_CERT": "/c"}, {"STATS_TLS_KEY": "/k"}} {
		m["NODE_NAME"] = "n1"
		if _, err := config.Parse(env(m), nil); err == nil || !strings.Contains(err.Error(), "STATS_TLS_CERT and STATS_TLS_KEY") {
			t.Errorf("%v: err %v, want both named", m, err)
		}
	}
	if _, err := config.Parse(env(map[string]string{"NODE_NAME": "n1", "METRICS_DELETED_WORKLOAD_GRACE": "soon"}), nil); err == nil ||
		!strings.Contains(err.Error(), "METRICS_DELETED_WORKLOAD_GRACE") {
		t.Errorf("a bad grace: %v", err)
	}
}

// TestAdaptiveProcs: on by default, off by ADAPTIVE_PROCS=false, and off
// whenever GOMAXPROCS is set, since then the operator chose the count.
func TestAdaptiveProcs(t *testing.T) {
	for _, tc := range []struct {
		env  map[string]string
		want bool
	}{
		{map[string]string{}, true},
		{map[string]string{"ADAPTIVE_PROCS": "false"}, false},
		{map[string]string{"GOMAXPROCS": "2"}, false},
		{map[string]string{"ADAPTIVE_PROCS": "true", "GOMAXPROCS": "4"}, false},
	} {
		tc.env["NODE_NAME"] = "n1"
		c, err := config.Parse(env(tc.env), nil)
		if err != nil {
			t.Fatalf("%v: %v", tc.env, err)
		}
		if c.AdaptiveProcs != tc.want {
			t.Errorf("%v: AdaptiveProcs %v, want %v", tc.env, c.AdaptiveProcs, tc.want)
		}
	}
}

// TestReleaseStartupCodeConfig: on by default, off by
// RELEASE_STARTUP_CODE=false.
func TestReleaseStartupCodeConfig(t *testing.T) {
	for _, tc := range []struct {
		env  map[string]string
		want bool
	}{
		{map[string]string{}, true},
		{map[string]string{"RELEASE_STARTUP_CODE": "false"}, false},
		{map[string]string{"RELEASE_STARTUP_CODE": "true"}, true},
	} {
		tc.env["NODE_NAME"] = "n1"
		c, err := config.Parse(env(tc.env), nil)
		if err != nil {
			t.Fatalf("%v: %v", tc.env, err)
		}
		if c.ReleaseStartupCode != tc.want {
			t.Errorf("%v: ReleaseStartupCode %v, want %v", tc.env, c.ReleaseStartupCode, tc.want)
		}
	}
}
