// Package main is a synthetic subcommand binary for TestFuncRule (never built).
package main

import (
	"fmt"

	"github.com/sandboxd/sandboxd/internal/stack"
	"github.com/sandboxd/sandboxd/internal/testimage"
)

// version is initialised for every subcommand, and clean.
var version = fmt.Sprint("v1")

func main() {}

// runnerCmd reaches the test images through a method of a type it uses, and a function.
func runnerCmd() error {
	var m mirror
	return m.start()
}

type mirror struct{}

func (mirror) start() error { return serve() }

func serve() error {
	_ = testimage.Busybox
	return nil
}

// gatewayCmd reaches the test environment through the imports of stack.
func gatewayCmd() { _ = stack.Config{} }

// controlPlaneCmd has a local named like the package's serve: no reference to it.
func controlPlaneCmd() {
	serve := func() error { return nil }
	_ = serve()
}

// dev may use the test images: it is no root of the rule.
func dev() { _ = serve() }
