package rules

import (
	"errors"
	"reflect"
	"strings"
	"testing"
)

func TestParseAnnotations(t *testing.T) {
	defaults := PodSettings{IPv6: true, DNSCapture: true}
	for _, tc := range []struct {
		name string
		ann  map[string]string
		want PodSettings
	}{
		{"none", nil, defaults},
		{"unrelated annotations", map[string]string{"foo": "bar"}, defaults},
		{"dns off", map[string]string{AnnotationDNSCapture: "false"}, PodSettings{IPv6: true}},
		{"dns on over an off default", map[string]string{AnnotationDNSCapture: " true "}, defaults},
		{"ingress", map[string]string{AnnotationBypassInboundCapture: "true"},
			PodSettings{IPv6: true, DNSCapture: true, BypassInboundCapture: true}},
		{"all lists", map[string]string{
			AnnotationRerouteVirtualIfaces:    "tap0, net1",
			AnnotationExcludeOutboundPorts:    "80, 443",
			AnnotationExcludeInboundPorts:     "15020",
			AnnotationExcludeOutboundIPRanges: "10.1.2.3/8, fd00::/8,192.168.1.7, 2001:db8::1",
		}, PodSettings{
			IPv6: true, DNSCapture: true,
			RerouteVirtualInterfaces: []string{"tap0", "net1"},
			ExcludeOutboundPorts:     []uint16{80, 443},
			ExcludeInboundPorts:      []uint16{15020},
			ExcludeOutboundIPRanges:  prefixes("10.0.0.0/8", "fd00::/8", "192.168.1.7/32", "2001:db8::1/128"),
		}},
		{"empty values", map[string]string{
			AnnotationExcludeOutboundPorts:    "",
			AnnotationExcludeOutboundIPRanges: " ",
			AnnotationRerouteVirtualIfaces:    "",
		}, defaults},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseAnnotations(tc.ann, defaults)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("got  %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

func TestParseAnnotationsErrorsNameAnnotationAndValue(t *testing.T) {
	defaults := PodSettings{DNSCapture: true}
	for _, tc := range []struct {
		ann       string
		value     string
		wantInMsg string
	}{
		{AnnotationDNSCapture, "yes", `want "true" or "false"`},
		{AnnotationBypassInboundCapture, "enabled", `want "true" or "false"`},
		{AnnotationExcludeOutboundPorts, "80,http", `invalid port "http"`},
		{AnnotationExcludeOutboundPorts, "80,,443", `invalid port ""`},
		{AnnotationExcludeOutboundPorts, "8000:8080", `invalid port "8000:8080"`},
		{AnnotationExcludeInboundPorts, "0", `invalid port "0"`},
		{AnnotationExcludeInboundPorts, "65536", `invalid port "65536"`},
		{AnnotationExcludeOutboundIPRanges, "*", `"*" is not supported`},
		{AnnotationExcludeOutboundIPRanges, "10.0.0.0/33", `invalid IP range "10.0.0.0/33"`},
		{AnnotationExcludeOutboundIPRanges, "::ffff:10.0.0.0/104", "IPv4-mapped"},
		{AnnotationExcludeOutboundIPRanges, "fe80::1%eth0", "zones"},
		{AnnotationRerouteVirtualIfaces, "tap0,this-name-is-too-long", `invalid interface name "this-name-is-too-long"`},
	} {
		t.Run(tc.ann+"="+tc.value, func(t *testing.T) {
			got, err := ParseAnnotations(map[string]string{tc.ann: tc.value}, defaults)
			var ae *AnnotationError
			if !errors.As(err, &ae) {
				t.Fatalf("err = %v, want *AnnotationError", err)
			}
			if ae.Annotation != tc.ann || ae.Value != tc.value {
				t.Errorf("error names %s=%q, want %s=%q", ae.Annotation, ae.Value, tc.ann, tc.value)
			}
			for _, want := range []string{tc.ann, tc.value, tc.wantInMsg} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("message %q lacks %q", err, want)
				}
			}
			if !reflect.DeepEqual(got, defaults) {
				t.Errorf("on error got %+v, want the defaults", got)
			}
		})
	}
}

func TestParseAnnotationsReportsEveryBadAnnotation(t *testing.T) {
	_, err := ParseAnnotations(map[string]string{
		AnnotationDNSCapture:           "maybe",
		AnnotationExcludeInboundPorts:  "x",
		AnnotationExcludeOutboundPorts: "443",
	}, PodSettings{})
	var names []string
	for _, e := range err.(interface{ Unwrap() []error }).Unwrap() {
		var ae *AnnotationError
		if errors.As(e, &ae) {
			names = append(names, ae.Annotation)
		}
	}
	want := []string{AnnotationDNSCapture, AnnotationExcludeInboundPorts}
	if !reflect.DeepEqual(names, want) {
		t.Fatalf("reported %v, want %v", names, want)
	}
}

// Anything ParseAnnotations accepts must turn into rules.
func FuzzParseAnnotations(f *testing.F) {
	f.Add("80,443", "10.0.0.0/8,fd00::/8", "15020", "tap0", "true")
	f.Add("", "", "", "", "false")
	f.Add("53", "0.0.0.0/0,::/0", "1,65535", "eth1, net1", "TRUE")
	f.Add("80,,443", "*", "0", "a/b", "yes")
	f.Fuzz(func(t *testing.T, outPorts, ranges, inPorts, ifaces, dns string) {
		s, err := ParseAnnotations(map[string]string{
			AnnotationExcludeOutboundPorts:    outPorts,
			AnnotationExcludeOutboundIPRanges: ranges,
			AnnotationExcludeInboundPorts:     inPorts,
			AnnotationRerouteVirtualIfaces:    ifaces,
			AnnotationDNSCapture:              dns,
		}, PodSettings{IPv6: true})
		if err != nil {
			var ae *AnnotationError
			if !errors.As(err, &ae) {
				t.Fatalf("error %v is not an *AnnotationError", err)
			}
			return
		}
		if _, err := InPod(s); err != nil {
			t.Fatalf("accepted settings %+v rejected by InPod: %v", s, err)
		}
	})
}
