package h1

import (
	"bufio"
	"bytes"
	"net/http"
	"net/url"
	"testing"
)

// benchHead is bench/waypoint's request head as its client sends it.
const benchHead = "POST /api/echo HTTP/1.1\r\nHost: server.demo.svc.cluster.local\r\nUser-Agent: Go-http-client/1.1\r\n" +
	"Content-Length: 1024\r\nContent-Type: application/octet-stream\r\nAccept-Encoding: gzip\r\n\r\n"

func BenchmarkReadRequestHead(b *testing.B) {
	in := []byte(benchHead)
	rd := bytes.NewReader(in)
	br := bufio.NewReaderSize(rd, BufSize)
	b.Run("quick", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			rd.Reset(in)
			br.Reset(rd)
			if quickRequest(in, br) == nil {
				b.Fatal("not in the subset")
			}
		}
	})
	b.Run("net-http", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			rd.Reset(in)
			br.Reset(rd)
			if _, err := http.ReadRequest(br); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// TestQuickRequest: the heads clients send go through quickRequest, the
// rest to http.ReadRequest (FuzzH1HeadDifferential compares the two).
func TestQuickRequest(t *testing.T) {
	for _, tc := range []struct {
		head  string
		quick bool
	}{
		{benchHead, true},
		{"GET /a?b=c HTTP/1.1\r\nHost: a\r\nAccept: */*\r\nConnection: keep-alive\r\n\r\n", true},
		{"GET / HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\nContent-Length: 0\r\n\r\n", true},
		{"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n", false},
		{"GET / HTTP/1.1\r\nHost: a\r\nPragma: no-cache\r\n\r\n", false},
		{"GET / HTTP/1.1\r\n\r\n", false},
		{"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", false},
		{"GET http://a/ HTTP/1.1\r\nHost: a\r\n\r\n", false},
		{"GET * HTTP/1.1\r\nHost: a\r\n\r\n", false},
		{"GET / HTTP/1.1\nHost: a\n\n", false},
		{"GET /\xff HTTP/1.1\r\nHost: a\r\n\r\n", false},
	} {
		r := quickRequest([]byte(tc.head), bufio.NewReader(bytes.NewReader(nil)))
		if (r != nil) != tc.quick {
			t.Errorf("quickRequest(%q) read it: %v, want %v", tc.head, r != nil, tc.quick)
		}
	}
	r := quickRequest([]byte(benchHead), bufio.NewReader(bytes.NewReader(nil)))
	if r.Host != "server.demo.svc.cluster.local" || r.Header.Get("Host") != "" || r.ContentLength != 1024 || r.URL.Path != "/api/echo" {
		t.Errorf("quickRequest read host %q, header %v, length %d, path %q", r.Host, r.Header, r.ContentLength, r.URL.Path)
	}
}

// TestOriginForm: for every byte in a path and in a query, and the
// shapes around '?', originForm reads the URL url.ParseRequestURI reads,
// or leaves the target to it.
func TestOriginForm(t *testing.T) {
	targets := []string{"/", "/api/echo", "/a?b", "/a?b?", "/a?", "/?", "/a??", "//x/y", "/a/../b", "/a;b=c@d:e", "a", "*", ""}
	for c := 0x21; c < 0x7f; c++ {
		targets = append(targets, "/p"+string(rune(c))+"q", "/p?q"+string(rune(c))+"r")
	}
	fast := 0
	for _, target := range targets {
		got := originForm(target)
		if got == nil {
			continue
		}
		fast++
		want, err := url.ParseRequestURI(target)
		if err != nil || *got != *want {
			t.Errorf("originForm(%q) = %#v, url.ParseRequestURI %#v (%v)", target, got, want, err)
		}
	}
	if fast < 100 {
		t.Errorf("only %d of %d targets took the fast path", fast, len(targets))
	}
}
