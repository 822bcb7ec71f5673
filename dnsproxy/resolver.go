package dnsproxy

import "github.com/ztunnel-go/ztunnel-go/dnsproxy/resolve"

// The answer decision lives in the leaf package resolve (no server in it);
// these names keep dnsproxy's API.
type (
	// Resolver decides the local answer to an A or AAAA query (resolve.Resolver).
	Resolver = resolve.Resolver
	// Answer is the decision for one query (resolve.Answer).
	Answer = resolve.Answer
	// CNAME is one CNAME record of an Answer (resolve.CNAME).
	CNAME = resolve.CNAME
)

// DefaultClusterDomain is the Kubernetes cluster domain when none is
// configured.
const DefaultClusterDomain = resolve.DefaultClusterDomain

// TTL is the time to live of every locally answered record, in seconds.
const TTL = resolve.TTL
