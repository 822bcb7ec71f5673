package hbone

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestParseAuthority(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want string // "" means an error
	}{
		{"10.0.0.1:80", "10.0.0.1:80"},
		{"127.0.0.1:65535", "127.0.0.1:65535"},
		{"[fd00::1]:8080", "[fd00::1]:8080"},
		{"[::ffff:10.0.0.1]:80", "[::ffff:10.0.0.1]:80"},
		{"example.com:80", ""},
		{"10.0.0.1", ""},
		{"10.0.0.1:", ""},
		{"10.0.0.1:0", ""},
		{"10.0.0.1:65536", ""},
		{"10.0.0.1:080", ""}, // not canonical
		{"::1:80", ""},       // IPv6 without brackets
		{"[fe80::1%eth0]:80", ""},
		{" 10.0.0.1:80", ""},
		{"10.0.0.1:80 ", ""},
		{"[FD00::1]:80", ""}, // not canonical (netip prints lowercase)
		{"", ""},
		{"010.0.0.1:80", ""},
	} {
		got, err := ParseAuthority(tc.in)
		if tc.want == "" {
			if err == nil || !errors.Is(err, ErrBadAuthority) {
				t.Errorf("ParseAuthority(%q) = %v, %v; want ErrBadAuthority", tc.in, got, err)
			} else {
				checkErrText(t, err)
			}
			continue
		}
		if err != nil || FormatAuthority(got) != tc.want {
			t.Errorf("ParseAuthority(%q) = %v, %v; want %s", tc.in, got, err, tc.want)
		}
	}
}

func FuzzParseAuthority(f *testing.F) {
	for _, s := range []string{"10.0.0.1:80", "[fd00::1]:8080", "example.com:80", "[::]:1", "1.2.3.4:0",
		"[fe80::1%eth0]:80", "::1:80", "", "[", "]:80", "1.2.3.4:99999"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		ap, err := ParseAuthority(s)
		if err != nil {
			return
		}
		// Whatever parses is canonical, round-trips and is dialable.
		if FormatAuthority(ap) != s {
			t.Fatalf("%q parsed to %v, which formats differently", s, ap)
		}
		if ap.Port() == 0 || ap.Addr().Zone() != "" || !ap.IsValid() {
			t.Fatalf("%q parsed to unusable %v", s, ap)
		}
		if again, err := ParseAuthority(FormatAuthority(ap)); err != nil || again != ap {
			t.Fatalf("round trip of %v: %v, %v", ap, again, err)
		}
	})
}

func TestBaggage(t *testing.T) {
	b := Baggage{
		ClusterName: "Kubernetes", Namespace: "default", WorkloadType: "deployment", WorkloadName: "productpage-v1",
		ServiceName: "productpage", ServiceVersion: "v1", Region: "us-east1", Zone: "us-east1-b",
	}
	s := b.String()
	want := "k8s.cluster.name=Kubernetes,k8s.namespace.name=default,k8s.deployment.name=productpage-v1," +
		"service.name=productpage,service.version=v1,cloud.region=us-east1,cloud.availability_zone=us-east1-b"
	if s != want {
		t.Errorf("String() = %q\nwant        %q", s, want)
	}
	if got := ParseBaggage(s); got != b {
		t.Errorf("ParseBaggage round trip = %+v, want %+v", got, b)
	}
	// Empty fields are omitted.
	if s := (Baggage{Namespace: "ns", WorkloadType: "pod", WorkloadName: "p"}).String(); s != "k8s.namespace.name=ns,k8s.pod.name=p" {
		t.Errorf("sparse baggage = %q", s)
	}
	// Lenient parsing: spaces, properties, unknown keys, junk members, escapes.
	got := ParseBaggage(" k8s.namespace.name = ns1 ;prop=1, junk, other=x,service.name=a%2Cb,k8s.job.name=j")
	if got != (Baggage{Namespace: "ns1", ServiceName: "a,b", WorkloadType: "job", WorkloadName: "j"}) {
		t.Errorf("lenient parse = %+v", got)
	}
	// Values that need escaping survive a round trip.
	odd := Baggage{ServiceName: "a b,c;d=e%f\"g\\h", Namespace: "ns"}
	if got := ParseBaggage(odd.String()); got != odd {
		t.Errorf("escaped round trip = %+v, want %+v (wire %q)", got, odd, odd.String())
	}
}

// TestBaggageLongValue: String never renders more than ParseBaggage reads.
// A member that would not fit is dropped whole, in render order, so a long
// escaped value neither comes back cut nor pushes the members after it out.
func TestBaggageLongValue(t *testing.T) {
	long := strings.Repeat("a b", 2000) // 6000 bytes, 10000 escaped
	b := Baggage{Namespace: "ns", ServiceName: long, ServiceVersion: "v1"}
	s := b.String()
	if len(s) > maxBaggageLen {
		t.Errorf("String() is %d bytes, more than the %d ParseBaggage reads", len(s), maxBaggageLen)
	}
	if want := "k8s.namespace.name=ns,service.version=v1"; s != want {
		t.Errorf("String() = %.80q, want %q", s, want)
	}
	// What parses renders in full, so it round-trips.
	for _, in := range []string{
		"service.name=" + long,
		"k8s.namespace.name=ns,service.name=" + strings.Repeat("%41", 2800),
		"k8s.namespace.name=ns,service.name=" + strings.Repeat("x", 9000),
	} {
		got := ParseBaggage(in)
		if again := ParseBaggage(got.String()); again != got {
			t.Errorf("round trip of %.60q: %.60q became %.60q", in, got.ServiceName, again.ServiceName)
		}
	}
	// A member cut by the 8 KiB limit is not read as a shorter value.
	if got := ParseBaggage("k8s.namespace.name=ns,service.name=" + strings.Repeat("x", 9000)); got != (Baggage{Namespace: "ns"}) {
		t.Errorf("cut member parsed to %.60q", got.ServiceName)
	}
}

func FuzzBaggage(f *testing.F) {
	f.Add("k8s.cluster.name=c,k8s.namespace.name=ns,k8s.deployment.name=d,service.name=s,service.version=v")
	f.Add("service.name=a%2Cb;p=1, k8s.pod.name = x")
	f.Add(",,,=,%,%%,%zz,k8s..name=v")
	f.Add(strings.Repeat("service.name=x,", 1000))
	f.Add("k8s.namespace.name=ns,service.name=" + strings.Repeat("a b", 2000))
	f.Fuzz(func(t *testing.T, s string) {
		b := ParseBaggage(s)
		// Whatever we parse we can render and parse back to the same thing,
		// as long as the workload type is one we render.
		if b.WorkloadType != "" && !validBaggageKeyPart(b.WorkloadType) {
			t.Fatalf("parsed invalid workload type %q", b.WorkloadType)
		}
		if again := ParseBaggage(b.String()); again != b {
			t.Fatalf("round trip of %+v gave %+v (wire %q)", b, again, b.String())
		}
	})
}

func TestForwarded(t *testing.T) {
	for _, tc := range []struct {
		client netip.AddrPort
		host   string
		want   string
	}{
		{netip.MustParseAddrPort("10.0.0.1:4567"), "", `for="10.0.0.1:4567"`},
		{netip.MustParseAddrPort("10.0.0.1:4567"), "reviews.default.svc.cluster.local",
			`for="10.0.0.1:4567";host=reviews.default.svc.cluster.local`},
		{netip.MustParseAddrPort("[fd00::1]:80"), "a b", `for="[fd00::1]:80";host="a b"`},
	} {
		got := BuildForwarded(tc.client, tc.host)
		if got != tc.want {
			t.Errorf("BuildForwarded = %q, want %q", got, tc.want)
		}
		if h := ForwardedHost(got); h != tc.host && !(tc.host == "a b" && h == "") {
			t.Errorf("ForwardedHost(%q) = %q, want %q", got, h, tc.host)
		}
	}
	for in, want := range map[string]string{
		`for="1.2.3.4:5";host=svc.ns`:         "svc.ns",
		`for="1.2.3.4:5";Host="svc.ns"`:       "svc.ns",
		`host=a, host=b`:                      "a",
		`for="1.2.3.4:5"`:                     "",
		"for=\"1.2.3.4:5\";host=\"sv\u00e9\"": "",
		`for="1.2.3.4:5"; host = svc ;by=x`:   "",
		``:                                    "",
	} {
		if got := ForwardedHost(in); got != want {
			t.Errorf("ForwardedHost(%q) = %q, want %q", in, got, want)
		}
	}
}

func FuzzForwarded(f *testing.F) {
	f.Add(`for="1.2.3.4:5";host=svc.ns.svc.cluster.local`)
	f.Add(`for="[::1]:5";host="quoted\"host"`)
	f.Add(`host=;host=;;,,`)
	f.Fuzz(func(t *testing.T, s string) {
		h := ForwardedHost(s)
		for i := 0; i < len(h); i++ {
			if h[i] <= 0x20 || h[i] >= 0x7f {
				t.Fatalf("ForwardedHost(%q) = %q: not printable ASCII", s, h)
			}
		}
		// A host we build is the host we read back.
		if h != "" && !strings.ContainsAny(h, `"\`) {
			if got := ForwardedHost(BuildForwarded(netip.MustParseAddrPort("10.0.0.1:1"), h)); got != h {
				t.Fatalf("host %q round-tripped to %q", h, got)
			}
		}
	})
}

func TestTraceparent(t *testing.T) {
	seen := map[string]bool{}
	for range 100 {
		tp := NewTraceparent()
		if !ValidTraceparent(tp) || len(tp) != TraceparentLen {
			t.Fatalf("NewTraceparent() = %q is not valid", tp)
		}
		if seen[tp] {
			t.Fatalf("duplicate traceparent %q", tp)
		}
		seen[tp] = true
	}
	for tp, want := range map[string]bool{
		"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01": true,
		"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0":  false,
		"00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01": false,
		"00-00000000000000000000000000000000-00f067aa0ba902b7-01": false,
		"00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01": false,
		"ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01": false,
		"00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01": false,
		"": false,
	} {
		if got := ValidTraceparent(tp); got != want {
			t.Errorf("ValidTraceparent(%q) = %v, want %v", tp, got, want)
		}
	}
	valid := "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	if TraceparentOrNew(valid) != valid {
		t.Error("TraceparentOrNew replaced a valid traceparent")
	}
	if g := TraceparentOrNew("garbage"); !ValidTraceparent(g) {
		t.Errorf("TraceparentOrNew(garbage) = %q", g)
	}
}

func FuzzTraceparent(f *testing.F) {
	f.Add("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
	f.Add("00-00000000000000000000000000000000-0000000000000000-00")
	f.Fuzz(func(t *testing.T, s string) {
		got := TraceparentOrNew(s)
		if !ValidTraceparent(got) || len(got) != TraceparentLen || !utf8.ValidString(got) {
			t.Fatalf("TraceparentOrNew(%q) = %q", s, got)
		}
		if ValidTraceparent(s) && got != s {
			t.Fatalf("valid %q was replaced", s)
		}
	})
}

func TestParseHostAuthority(t *testing.T) {
	for _, tc := range []struct {
		in   string
		host string // "" means an error
		port uint16
	}{
		{"reviews.default.svc.cluster.local:9080", "reviews.default.svc.cluster.local", 9080},
		{"Reviews.Default.SVC.cluster.local:1", "reviews.default.svc.cluster.local", 1},
		{"a:65535", "a", 65535},
		{"api-v2.example.com:443", "api-v2.example.com", 443},
		{"1a.example.com:80", "1a.example.com", 80},
		{strings.Repeat("a", 63) + ".com:80", strings.Repeat("a", 63) + ".com", 80},
		{strings.Repeat("a", 64) + ".com:80", "", 0}, // label over 63
		{strings.Repeat("a.", 126) + "ab:80", "", 0}, // 254 characters
		{"reviews:0", "", 0},
		{"reviews:65536", "", 0},
		{"reviews:080", "", 0},
		{"reviews:", "", 0},
		{"reviews", "", 0},
		{"reviews:8o", "", 0},
		{":80", "", 0},
		{"example.com.:80", "", 0}, // trailing dot
		{"a..b:80", "", 0},
		{"-a.com:80", "", 0},
		{"a-.com:80", "", 0},
		{"a_b.com:80", "", 0},
		{"*.example.com:80", "", 0},
		{"10.0.0.1:80", "", 0},    // an IP, not a name
		{"010.0.0.1:80", "", 0},   // nor in a non-canonical spelling
		{"4294967295:80", "", 0},  // nor as one number
		{"[fd00::1]:80", "", 0},   // nor in brackets
		{"host name:80", "", 0},   // no spaces
		{"reviews:80\x00", "", 0}, // nothing after the port
		{"ex\u00e4mple.com:80", "", 0},
	} {
		host, port, err := ParseHostAuthority(tc.in)
		if tc.host == "" {
			if !errors.Is(err, ErrBadHostAuthority) {
				t.Errorf("ParseHostAuthority(%q) = %q, %d, %v; want ErrBadHostAuthority", tc.in, host, port, err)
			} else {
				checkErrText(t, err)
			}
			continue
		}
		if err != nil || host != tc.host || port != tc.port {
			t.Errorf("ParseHostAuthority(%q) = %q, %d, %v; want %q, %d", tc.in, host, port, err, tc.host, tc.port)
		}
	}
}

func FuzzParseHostAuthority(f *testing.F) {
	for _, s := range []string{"reviews.default.svc.cluster.local:9080", "a:1", "10.0.0.1:80", "[::1]:80", "a..b:1", "A-b.C:65535"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		host, port, err := ParseHostAuthority(s)
		if err != nil {
			return
		}
		// What parses is a lower-case name that no IP parser accepts and
		// that parses again to itself.
		if _, err := netip.ParseAddr(host); err == nil {
			t.Fatalf("%q: host %q is an IP", s, host)
		}
		if _, err := ParseAuthority(s); err == nil {
			t.Fatalf("%q parses as both ip:port and hostname:port", s)
		}
		if host != strings.ToLower(host) || port == 0 {
			t.Fatalf("%q: %q, %d", s, host, port)
		}
		h2, p2, err := ParseHostAuthority(host + ":" + strconv.Itoa(int(port)))
		if err != nil || h2 != host || p2 != port {
			t.Fatalf("%q: round trip %q, %d, %v", s, h2, p2, err)
		}
	})
}

// TestServerHostnameAuthority: with AcceptHostnames a hostname:port
// CONNECT reaches the handler with Host set and only the port in
// Authority; without it the same request is refused with 400 before the
// handler (TestBadInputRequests covers the default), and a malformed name
// is refused either way.
func TestServerHostnameAuthority(t *testing.T) {
	m := newMesh(t)
	up := startUpstream(t, echo)
	got := make(chan *Request, 1)
	srv := startServer(t, m, HandlerFunc(func(ctx context.Context, req *Request) Reply {
		got <- req
		var d net.Dialer
		c, err := d.DialContext(ctx, "tcp", up.addr.String())
		if err != nil {
			return Reply{Status: 503}
		}
		return Reply{Upstream: c}
	}), func(c *ServerConfig) { c.AcceptHostnames = true })
	p := newPool(t, m)

	req := connectReq(srv, netip.AddrPortFrom(netip.Addr{}, 9080))
	req.Host = "reviews.default.svc.cluster.local"
	tun := mustConnect(t, p, req)
	defer tun.Close()
	roundTrip(t, tun, "by name")
	r := <-got
	if r.Host != req.Host || r.Authority.Port() != 9080 || r.Authority.Addr().IsValid() {
		t.Fatalf("handler saw Host %q Authority %v; want %q and port 9080 without an address", r.Host, r.Authority, req.Host)
	}

	// An ip:port authority still arrives as before.
	tun2 := mustConnect(t, p, connectReq(srv, up.addr))
	defer tun2.Close()
	if r := <-got; r.Host != "" || r.Authority != up.addr {
		t.Fatalf("handler saw Host %q Authority %v; want %v", r.Host, r.Authority, up.addr)
	}

	bad := connectReq(srv, netip.AddrPortFrom(netip.Addr{}, 80))
	bad.Host = "bad_name.example.com"
	var se *StatusError
	if _, err := p.Connect(testCtx(t), bad); !errors.As(err, &se) || se.Code != 400 {
		t.Fatalf("malformed hostname: err %v, want status 400", err)
	}
	waitFor(t, "the rejection log", func() bool { return logsContaining(srv.logs, "rejected CONNECT") == 1 })
	if reason := srv.logs.FilterMessage("hbone: rejected CONNECT").All()[0].ContextMap()["reason"].(string); !strings.Contains(reason, "not hostname:port (character") {
		t.Errorf("rejection reason %q", reason)
	}
	select {
	case r := <-got:
		t.Fatalf("handler called for a malformed authority: %+v", r)
	default:
	}
}
