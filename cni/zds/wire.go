// Package zds is the ZDS protocol (docs/protocol.md#zds) between the CNI
// node agent and the node proxy, both ends: Server is the agent side (it
// listens on an AF_UNIX SOCK_SEQPACKET socket and pushes pods with their
// network namespace fds), Client is the proxy side (it connects, says hello,
// and hands each pod to a Handler). One protobuf message per datagram, every
// request answered by exactly one ack before the next is sent.
//
// It is not the agent's pod cache nor the proxy's workload manager: which pods
// exist (Snapshotter) and what starting a pod's proxy means (Handler) belong to
// the callers.
package zds

import (
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"

	"github.com/ztunnel-go/ztunnel-go/internal/api/zdsapi"
)

// MaxMessageSize is the receive buffer of both ends; a longer datagram is
// truncated by the kernel and rejected (ErrTruncated).
const MaxMessageSize = 1024

// maxFDs is how many fds a receive has room for. Only one is ever valid; room
// for a few more lets us report (and close) extras instead of losing them to
// MSG_CTRUNC.
const maxFDs = 8

// DefaultAckTimeout bounds the wait for the answer to one message.
const DefaultAckTimeout = 5 * time.Second

var (
	// ErrTruncated: a datagram or its control data did not fit the receive
	// buffers (MSG_TRUNC / MSG_CTRUNC).
	ErrTruncated = errors.New("zds: message truncated")
	// ErrProtocol marks a message that decodes but breaks the protocol rules
	// (wrong payload, wrong number of fds, unexpected hello version).
	ErrProtocol = errors.New("zds: protocol violation")
	// ErrNoProxy: AddWorkload found no connected proxy. The agent marks the
	// pod pending and fails the CNI ADD (fail closed).
	ErrNoProxy = errors.New("zds: no node proxy connected")
)

// NackError is the proxy's refusal of one request (a non-empty Ack.error).
type NackError struct {
	// Reason is the proxy's Ack.error text.
	Reason string
}

func (e *NackError) Error() string { return "zds: proxy refused: " + e.Reason }

// readMsg receives one datagram into buf, taking the fds it carries. The
// caller owns the returned fds, also when err != nil (they are closed here on
// truncation, so then none are returned). n == 0 with no error never
// happens: an empty read is io.EOF (no valid message is empty).
func readMsg(c *net.UnixConn, buf []byte) (n int, fds []int, err error) {
	oob := make([]byte, unix.CmsgSpace(4*maxFDs))
	n, oobn, flags, _, err := c.ReadMsgUnix(buf, oob)
	if oobn > 0 {
		var perr error
		fds, perr = parseRights(oob[:oobn])
		if err == nil {
			err = perr
		}
	}
	if err != nil {
		closeFDs(fds)
		return 0, nil, err
	}
	if flags&(unix.MSG_TRUNC|unix.MSG_CTRUNC) != 0 {
		closeFDs(fds)
		return 0, nil, fmt.Errorf("%w (flags %#x, %d byte buffer)", ErrTruncated, flags, len(buf))
	}
	if n == 0 && len(fds) == 0 {
		return 0, nil, io.EOF
	}
	return n, fds, nil
}

func parseRights(oob []byte) ([]int, error) {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil, fmt.Errorf("zds: control message: %w", err)
	}
	var fds []int
	for i := range msgs {
		got, err := unix.ParseUnixRights(&msgs[i])
		if err != nil {
			continue // not SCM_RIGHTS (credentials etc.): nothing to own
		}
		fds = append(fds, got...)
	}
	return fds, nil
}

// writeMsg sends m as one datagram with fds (none when fds is empty).
func writeMsg(c *net.UnixConn, m proto.Message, fds ...int) error {
	b, err := proto.Marshal(m)
	if err != nil {
		return fmt.Errorf("zds: marshal: %w", err)
	}
	if len(b) > MaxMessageSize {
		return fmt.Errorf("zds: %d byte message exceeds %d: %w", len(b), MaxMessageSize, ErrTruncated)
	}
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	if _, _, err := c.WriteMsgUnix(b, oob, nil); err != nil {
		return fmt.Errorf("zds: send: %w", err)
	}
	return nil
}

func closeFDs(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
}

// DecodeRequest decodes one agent→proxy datagram and checks it is well
// formed: exactly one payload, and a non-empty uid for add, keep and del.
// File descriptor rules are checked separately (they travel beside the
// bytes).
func DecodeRequest(b []byte) (*zdsapi.WorkloadRequest, error) {
	req := &zdsapi.WorkloadRequest{}
	if err := proto.Unmarshal(b, req); err != nil {
		return nil, fmt.Errorf("zds: decode request: %w", err)
	}
	var uid string
	switch p := req.GetPayload().(type) {
	case *zdsapi.WorkloadRequest_Add:
		if p.Add == nil {
			return nil, fmt.Errorf("%w: empty add", ErrProtocol)
		}
		uid = p.Add.GetUid()
	case *zdsapi.WorkloadRequest_Keep:
		uid = p.Keep.GetUid()
	case *zdsapi.WorkloadRequest_Del:
		uid = p.Del.GetUid()
	case *zdsapi.WorkloadRequest_SnapshotSent:
		return req, nil
	default:
		return nil, fmt.Errorf("%w: request without a known payload", ErrProtocol)
	}
	if uid == "" {
		return nil, fmt.Errorf("%w: request without a uid", ErrProtocol)
	}
	return req, nil
}

// checkFDs applies the fd rules to a decoded request that came with nfds
// descriptors: add carries exactly one, nothing else carries any.
func checkFDs(req *zdsapi.WorkloadRequest, nfds int) error {
	if req.GetAdd() != nil {
		if nfds != 1 {
			return fmt.Errorf("%w: add carries %d file descriptors, want exactly 1 (the netns)", ErrProtocol, nfds)
		}
		return nil
	}
	if nfds != 0 {
		return fmt.Errorf("%w: %s carries %d file descriptors, want none", ErrProtocol, payloadName(req), nfds)
	}
	return nil
}

func payloadName(req *zdsapi.WorkloadRequest) string {
	switch req.GetPayload().(type) {
	case *zdsapi.WorkloadRequest_Add:
		return "add"
	case *zdsapi.WorkloadRequest_Keep:
		return "keep"
	case *zdsapi.WorkloadRequest_Del:
		return "del"
	case *zdsapi.WorkloadRequest_SnapshotSent:
		return "snapshot_sent"
	}
	return "unknown"
}

// decodeAck decodes one proxy→agent datagram, which must be an ack. A NACK is
// returned as *NackError.
func decodeAck(b []byte) error {
	resp := &zdsapi.WorkloadResponse{}
	if err := proto.Unmarshal(b, resp); err != nil {
		return fmt.Errorf("%w: decode response: %w", ErrProtocol, err)
	}
	ack := resp.GetAck()
	if ack == nil {
		return fmt.Errorf("%w: response is not an ack", ErrProtocol)
	}
	if ack.GetError() != "" {
		return &NackError{Reason: ack.GetError()}
	}
	return nil
}
