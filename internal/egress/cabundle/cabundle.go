// Package cabundle joins a sandbox's CA bundle (bundle.pem: the roots a sandbox trusts,
// then its egress CA's certificate). It is a leaf of the standard library alone, so
// that sandbox-gate, which writes the bundle inside every Kubernetes sandbox Pod and must
// stay small, shares it with internal/egress (egress.Bundle) without linking the proxy.
package cabundle

// Join is bundle.pem: roots, a newline when they do not end with one, then caPEM.
func Join(roots, caPEM []byte) []byte {
	out := make([]byte, 0, len(roots)+1+len(caPEM))
	out = append(out, roots...)
	if len(roots) > 0 && roots[len(roots)-1] != '\n' {
		out = append(out, '\n')
	}
	return append(out, caPEM...)
}
