// Package main is a synthetic binary whose initialisation (run by every subcommand)
// reaches the test images, for TestFuncRule (never built).
package main

import "github.com/sandboxd/sandboxd/internal/testimage"

var hook = serve

func init() { _ = hook }

func serve() string { return testimage.Busybox }

func main() {}

func runnerCmd() {}
