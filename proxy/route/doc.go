// Package route is the node proxy's outbound routing decision: a pure
// function of one state snapshot, the source workload and the original
// destination (Outbound), returning a Decision the 15001 listener carries
// out without looking anything up again; and the inbound decision of a
// pod's node proxy for an HBONE CONNECT (Inbound): whether the authority is
// this pod's, what the application is dialled at, and what authorization
// evaluates. The rules of who is a service's waypoint serve both.
//
// It holds no sockets and starts nothing, so zctl links it to explain a
// route offline without linking the listeners in package proxy.
package route
