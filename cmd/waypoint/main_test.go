package main

import (
	"strings"
	"testing"
)

func TestParseFlags(t *testing.T) {
	o, err := parseFlags([]string{"--gateway", "demo/wp", "--ip", "10.0.0.7", "--node-name", "n1", "--xds-address", "cp:15012"})
	if err != nil {
		t.Fatal(err)
	}
	if o.ServiceAccount != "wp" || o.PodName != "waypoint-wp" || o.CAAddress != "cp:15012" || o.Listen != ":15008" {
		t.Errorf("defaults: %+v", o)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--ip", "10.0.0.7", "--node-name", "n"}, "--gateway"},
		{[]string{"--gateway", "demo/wp", "--ip", "x", "--node-name", "n"}, "--ip"},
		{[]string{"--gateway", "demo/wp", "--ip", "10.0.0.7"}, "--node-name"},
		{[]string{"--gateway", "demo/wp", "--ip", "10.0.0.7", "--node-name", "n", "--admin-addr", "0.0.0.0:15000"}, "--admin-addr"},
	} {
		if _, err := parseFlags(tc.args); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("parseFlags(%v) = %v, want an error naming %s", tc.args, err, tc.want)
		}
	}
}
