// Package e2e holds end-to-end tests that run the real binaries in a cluster
// of network namespaces (internal/testing/testcluster), as root: traffic capture by
// the CNI plugin and node agent, and later the node proxy. `make e2e` runs
// them with -p 1.
//
// It is tests only: no code here is imported by the product.
package e2e
