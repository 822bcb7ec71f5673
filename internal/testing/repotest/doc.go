// Package repotest holds repository-wide checks that run with `go test`:
//
//   - every package carries exactly one package doc comment;
//   - the layout by owner holds: only the owner folders (node, controlplane,
//     testing) and the shared packages sit directly under internal/, and
//     the prefix rules in layoutRules (the node never links the control
//     plane, the control plane never links the data path, nothing outside
//     the test trees links internal/testing) are kept;
//   - each binary links exactly the packages its committed cmd/<bin>/deps.txt
//     lists, so a new dependency shows up in review;
//   - the waypoint's filter stages (proxy/waypoint/authn, authz, routing,
//     telemetry, h1, upstream) never link each other, only the packages
//     they share (stream, wire);
//   - our protos never clash with Istio's Go types in the registry.
//
// It has no code of its own besides these tests.
package repotest
