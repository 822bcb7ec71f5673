package xds

import (
	"errors"
	"fmt"
	"maps"
	"runtime"
	"strings"
	"sync"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
)

// handler turns DeltaDiscoveryResponses into Sink calls and ACK/NACK requests
// (wire.go's deltaResponse and deltaRequest).
// It outlives streams: the accepted versions and the synced state carry over
// reconnects. handle is called by one goroutine at a time (the stream's
// receive loop); mu only guards what other goroutines read (versions).
type handler struct {
	sink Sink
	// types are the subscribed type URLs, in subscription order: typeURLs,
	// plus WaypointType (one explicit name, waypoint) for a waypoint.
	types    []string
	waypoint string

	mu       sync.Mutex
	versions map[string]map[string]string // type URL → name → accepted version

	seen     map[string]bool // types whose first response has been applied
	synced   chan struct{}
	isSynced bool
}

func newHandler(sink Sink) *handler { return newWaypointHandler(sink, "") }

// newWaypointHandler also subscribes to waypoint's WaypointType config
// ("": none).
func newWaypointHandler(sink Sink, waypoint string) *handler {
	h := &handler{
		sink:     sink,
		types:    typeURLs[:],
		waypoint: waypoint,
		versions: make(map[string]map[string]string, len(typeURLs)),
		seen:     make(map[string]bool, len(typeURLs)),
		synced:   make(chan struct{}),
	}
	if waypoint != "" {
		h.types = append(h.types[:len(h.types):len(h.types)], WaypointType)
	}
	for _, t := range h.types {
		h.versions[t] = map[string]string{}
	}
	return h
}

// initialRequest is the first request of a stream for typeURL: a wildcard
// subscription (no names) carrying the versions held from earlier streams.
func (h *handler) initialRequest(typeURL string) *deltaRequest {
	h.mu.Lock()
	defer h.mu.Unlock()
	var held map[string]string
	if v := h.versions[typeURL]; len(v) > 0 {
		held = maps.Clone(v)
	}
	req := &deltaRequest{typeURL: typeURL, initialVersions: held}
	if typeURL == WaypointType {
		req.subscribe = []string{h.waypoint}
	}
	return req
}

// resourceVersions returns a copy of the accepted versions of typeURL.
func (h *handler) resourceVersions(typeURL string) map[string]string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return maps.Clone(h.versions[typeURL])
}

// handle applies resp to the sink and returns the ACK (or NACK, with
// error_detail set) to send back. It never returns nil.
func (h *handler) handle(resp *deltaResponse) *deltaRequest {
	typeURL := resp.typeURL
	ack := &deltaRequest{typeURL: typeURL, responseNonce: resp.nonce}
	var err error
	switch typeURL {
	case AddressType:
		err = apply(h, typeURL, resp, h.sink.ApplyAddresses)
	case AuthorizationType:
		err = apply(h, typeURL, resp, h.sink.ApplyAuthorizations)
	case WaypointType:
		if ws, ok := h.sink.(WaypointSink); ok && h.waypoint != "" {
			err = apply(h, typeURL, resp, ws.ApplyWaypoints)
		} else {
			err = fmt.Errorf("unsubscribed type URL %q", typeURL)
		}
	default:
		err = fmt.Errorf("unknown type URL %q", typeURL)
	}
	if err != nil {
		ack.errorDetail = &rpcStatus{code: int32(codes.InvalidArgument), message: err.Error()}
	}
	return ack
}

// parallelDecodeMin is the response size from which resources are decoded
// on all CPUs.
const parallelDecodeMin = 2048

// apply decodes the resources of one response, hands them to the sink and
// records the accepted versions. The returned error is the NACK message.
func apply[M any, PM interface {
	*M
	proto.Message
}](h *handler, typeURL string, resp *deltaResponse, sinkFn func(map[string]PM, []string) error) error {
	res := resp.resources
	upserts := make(map[string]PM, len(res))
	versions := make(map[string]string, len(res))
	bad := ResourceErrors{}
	// Decode first (in parallel for a large response such as a full sync:
	// it is a quarter of the sync's CPU), then index in order.
	decoded := make([]PM, len(res))
	errs := make([]error, len(res))
	decode := func(i int) {
		r := &res[i]
		switch {
		case r.name == "":
			errs[i] = errors.New("resource has no name")
		case !r.hasBody:
			errs[i] = errors.New("resource has no body")
		case r.bodyType != typeURL:
			errs[i] = fmt.Errorf("resource type %q in a %q response", r.bodyType, typeURL)
		default:
			m := PM(new(M))
			// Unmarshal copies what it keeps: r.body aliases the response.
			if err := proto.Unmarshal(r.body, m); err != nil {
				errs[i] = fmt.Errorf("decode: %w", err)
				return
			}
			decoded[i] = m
		}
	}
	if workers := runtime.GOMAXPROCS(0); len(res) >= parallelDecodeMin && workers > 1 {
		var wg sync.WaitGroup
		chunk := (len(res) + workers - 1) / workers
		for lo := 0; lo < len(res); lo += chunk {
			hi := min(lo+chunk, len(res))
			wg.Go(func() {
				for i := lo; i < hi; i++ {
					decode(i)
				}
			})
		}
		wg.Wait()
	} else {
		for i := range res {
			decode(i)
		}
	}
	for i := range res {
		name := res[i].name
		if errs[i] != nil {
			bad[name] = errs[i]
			continue
		}
		upserts[name] = decoded[i]
		versions[name] = res[i].version
	}
	// A name sent twice with one undecodable copy is rejected as a whole.
	for name := range bad {
		delete(upserts, name)
		delete(versions, name)
	}
	removes := resp.removed

	var sinkErr error
	if len(upserts) > 0 || len(removes) > 0 {
		sinkErr = sinkFn(upserts, removes)
	}

	h.mu.Lock()
	held := h.versions[typeURL]
	var named rejectedNamer
	switch {
	case sinkErr == nil:
	case errors.As(sinkErr, &named):
		for _, n := range named.RejectedNames() {
			delete(versions, n)
		}
	default:
		clear(versions)
	}
	maps.Copy(held, versions)
	for _, n := range removes {
		delete(held, n)
	}
	h.seen[typeURL] = true
	if !h.isSynced && h.seen[AddressType] && h.seen[AuthorizationType] && (h.waypoint == "" || h.seen[WaypointType]) {
		h.isSynced = true
		close(h.synced)
	}
	h.mu.Unlock()

	var msgs []string
	if len(bad) > 0 {
		msgs = append(msgs, bad.Error())
	}
	if sinkErr != nil {
		msgs = append(msgs, sinkErr.Error())
	}
	if len(msgs) == 0 {
		return nil
	}
	return errors.New(strings.Join(msgs, "; "))
}
