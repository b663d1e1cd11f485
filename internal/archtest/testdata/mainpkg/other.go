package main

type handler struct{}

func (handler) ServeHTTP() { _ = serve() }

// apikey calls handler's method through an interface: reaching the type (where the
// value is made) reaches its methods.
func apikey() {
	var h interface{ ServeHTTP() } = handler{}
	h.ServeHTTP()
}
