// Package runtimetest tests runtime.Backends and what drives them, for tests only:
//
//   - Run is the contract every backend honours (in the manner of containerd's
//     snapshotter testsuite): the local and the Kubernetes backends run it against a real
//     container runtime, so their behaviour cannot drift apart.
//   - Fake is a scriptable backend that runs nothing, for testing the runner's state
//     machine without root or containers.
package runtimetest
