// Command testapp is the one static binary of the real node's test images
// (hack/images/testimage): the pod sandbox's pause process and the test
// workloads.
//
//	testapp pause            block until SIGTERM/SIGINT, reaping orphans (the sandbox image)
//	testapp serve [-listen :8080] [-headers] [-close]
//	                         HTTP server answering "pod=<POD_NAME> ns=<POD_NAMESPACE> from=<client addr>";
//	                         -headers adds one "header <Name>: <value>" line per request header,
//	                         -close answers Connection: close (each request its own connection)
//	testapp get [-timeout 5s] URL
//	                         GET URL once, print the body; exit 1 on any failure
//	testapp lookup [-timeout 5s] HOST
//	                         resolve HOST through the pod's resolv.conf, print its addresses one a line
//	testapp loop [-url URL -want TEXT] [-workers 1] [-lookup HOST] [-interval 50ms] [-timeout 3s] [-slow 4s] [-control 127.0.0.1:9090]
//	                         until stopped: GET URL on a new connection each time, and resolve HOST,
//	                         counting every failure; the control address serves /stats, /reset, /stop (loop.go)
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"os"
	"os/signal"
	"slices"
	"syscall"
	"time"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: testapp pause|serve|get|lookup|loop ...")
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "pause":
		pause()
	case "serve":
		err = serve(os.Args[2:])
	case "get":
		err = get(os.Args[2:])
	case "lookup":
		err = lookup(os.Args[2:])
	case "loop":
		err = loop(os.Args[2:])
	default:
		err = fmt.Errorf("unknown command %q", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "testapp:", err)
		os.Exit(1)
	}
}

// pause is what the Kubernetes pause container does: hold the sandbox's
// namespaces, reap zombies (it is PID 1 of a shared PID namespace) and exit
// on SIGTERM or SIGINT.
func pause() {
	sig := make(chan os.Signal, 4)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	for s := range sig {
		if s != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			var ws syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}

func serve(args []string) error {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	listen := fs.String("listen", ":8080", "address to listen on")
	headers := fs.Bool("headers", false, "echo the request's headers, one line each")
	closeConn := fs.Bool("close", false, "answer Connection: close")
	if err := fs.Parse(args); err != nil {
		return err
	}
	name, ns := os.Getenv("POD_NAME"), os.Getenv("POD_NAMESPACE")
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if *closeConn {
			w.Header().Set("Connection", "close")
		}
		fmt.Fprintf(w, "pod=%s ns=%s from=%s\n", name, ns, r.RemoteAddr)
		if *headers {
			for _, k := range slices.Sorted(maps.Keys(r.Header)) {
				for _, v := range r.Header[k] {
					fmt.Fprintf(w, "header %s: %s\n", k, v)
				}
			}
		}
	})
	l, err := net.Listen("tcp", *listen)
	if err != nil {
		return fmt.Errorf("listen %s: %w", *listen, err)
	}
	fmt.Printf("testapp: serving on %s\n", l.Addr())
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	if err := srv.Serve(l); err != nil && err != http.ErrServerClosed {
		return fmt.Errorf("serve: %w", err)
	}
	return nil
}

func get(args []string) error {
	fs := flag.NewFlagSet("get", flag.ContinueOnError)
	timeout := fs.Duration("timeout", 5*time.Second, "whole request timeout")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return fmt.Errorf("get: want one URL, got %d arguments", fs.NArg())
	}
	c := &http.Client{Timeout: *timeout, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := c.Get(fs.Arg(0))
	if err != nil {
		return fmt.Errorf("get %s: %w", fs.Arg(0), err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return fmt.Errorf("get %s: body: %w", fs.Arg(0), err)
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("get %s: %s: %s", fs.Arg(0), resp.Status, body)
	}
	os.Stdout.Write(body)
	return nil
}

func lookup(args []string) error {
	fs := flag.NewFlagSet("lookup", flag.ContinueOnError)
	timeout := fs.Duration("timeout", 5*time.Second, "whole lookup timeout")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return fmt.Errorf("lookup: want one host, got %d arguments", fs.NArg())
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	addrs, err := net.DefaultResolver.LookupHost(ctx, fs.Arg(0))
	if err != nil {
		return fmt.Errorf("lookup %s: %w", fs.Arg(0), err)
	}
	for _, a := range addrs {
		fmt.Println(a)
	}
	return nil
}
