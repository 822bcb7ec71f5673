// Package repotest holds repository-wide checks that run with `go test`: every
// package carries a package doc comment, and the data path does not import
// what it must not (Kubernetes clients, the node state, the CA). It has no
// code of its own besides these tests.
package repotest
