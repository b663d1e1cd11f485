// Package egress holds the host-side servers that make a sandbox's dns_name egress grants
// enforceable on the local backend.
//
// nftables on the host DNATs a sandbox's TCP 443 traffic that its CIDR and any rules do
// not cover to a Proxy on the bridge's gateway address. The Proxy reads the TLS
// ClientHello's server name, checks it against the sandbox's grants (MatchName), resolves
// the name itself and splices the connection to what the name resolves to, never to the
// packet's original destination. It never decrypts: the sandbox talks TLS to the real
// server, which presents its own certificate. A connection without a server name, or
// with an IP literal as server name, is refused, so a grant cannot be used to reach an
// arbitrary address.
//
// Every sandbox's resolv.conf names the DNS forwarder on the same gateway address: DNS
// relays queries to the host's upstream resolvers over UDP and TCP, and answers even a
// sandbox that may send nothing else (deny_egress), so that granted names resolve.
package egress
