package main

import (
	"context"
	"encoding/json"
	"net"
	"net/netip"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/ztunnel-go/ztunnel-go/hbone"
	"github.com/ztunnel-go/ztunnel-go/internal/identity"
	"github.com/ztunnel-go/ztunnel-go/internal/node/state"
	"github.com/ztunnel-go/ztunnel-go/internal/xds"
	"github.com/ztunnel-go/ztunnel-go/proxy/eastwest"
	"github.com/ztunnel-go/ztunnel-go/proxy/waypoint"
	"github.com/ztunnel-go/ztunnel-go/proxy/waypoint/telemetry/tracing"
)

// dataPlane is what the mode (--mode) runs on the HBONE listener; the
// rest of the binary (xDS, certificates, admin, supervision) is shared.
type dataPlane struct {
	sink     xds.Sink
	waypoint string // the xDS waypoint config subscribed to; "" for none
	serve    func(net.Listener) error
	shutdown func(context.Context) error
	dump     func() []byte // /config_dump
}

// newDataPlane builds the waypoint or the east-west gateway; closeDP
// releases what it opened.
func newDataPlane(o *options, id identity.Identity, ip netip.Addr, certs identity.CertSource, rev hbone.Revocation,
	log *zap.Logger, access *accessLog, reg prometheus.Registerer) (dp dataPlane, closeDP func(), err error) {
	if o.Mode == modeEastWest {
		// The workload API is all it reads; it originates no HBONE of its
		// own (the inner connection is the client's), so it needs no pool.
		st := state.NewStore()
		gw, err := eastwest.New(eastwest.Options{Identity: id, Certs: certs, State: st, Network: o.Network,
			Revocation: rev, Log: log.Named("eastwest"), Registerer: reg})
		if err != nil {
			return dataPlane{}, nil, err
		}
		return dataPlane{sink: st, serve: gw.Serve, shutdown: gw.Shutdown, dump: func() []byte {
			b, _ := json.MarshalIndent(st.Load().Dump(), "", "  ")
			return b
		}}, func() {}, nil
	}
	pool, err := hbone.NewPool(hbone.PoolConfig{ClientConfig: hbone.ClientConfig{Certs: certs, Revocation: rev}})
	if err != nil {
		return dataPlane{}, nil, err
	}
	ns, _, _ := strings.Cut(o.Gateway, "/")
	w, err := waypoint.New(waypoint.Options{
		Name: o.Gateway, Identity: id, IP: ip, Certs: certs, Pool: pool,
		Log: log, Access: access.log, AccessLines: access.lines, Registerer: reg, Revocation: rev,
		Trace:          tracing.Identity{NodeID: "waypoint~" + ip.String() + "~" + o.PodName + "." + ns + "~" + ns + ".svc.cluster.local"},
		DefaultTracing: defaultTracing(o),
	})
	if err != nil {
		pool.Close()
		return dataPlane{}, nil, err
	}
	return dataPlane{sink: w.Sink(), waypoint: o.Gateway, serve: w.Serve, shutdown: w.Shutdown, dump: func() []byte {
		raw := w.Config().Raw()
		if raw == nil {
			return []byte("{}")
		}
		b, _ := protojson.MarshalOptions{Multiline: true}.Marshal(raw)
		return b
	}}, func() { pool.Close() }, nil
}
