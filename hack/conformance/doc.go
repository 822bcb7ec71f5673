// Package conformance runs Gateway API's mesh conformance suite against the
// waypoint on the real node (see conformance_test.go and
// docs/conformance/README.md).
package conformance
