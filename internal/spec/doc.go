// Package spec converts a sandbox's spec between the public wire form
// (coreweave.sandbox.v1 SandboxSpec) and what a runner runs (runner.CreateRequest,
// runtime.Spec), in both directions, and owns the shape checks of that conversion.
//
// Public to runtime: ToCreateRequest checks the shape of a spec (every problem at once,
// as field violations; what this sandboxd cannot do yet as NOT_IMPLEMENTED) and converts
// it; the gateway runs it on what the caller sent and on each runner's resolved spec.
// Runtime to public: ForPolicy renders what a runner is asked to run in the form its
// policy is written against (the runner re-checks every create with its own policy), and
// EffectiveNetwork and ServiceStatuses render what a sandbox enforces and publishes for
// its status.
//
// Both sides use it, so it never imports the gateway (internal/archtest). The runner
// wire (sandboxd.runner.v1) has its own, lossless conversion in runnerapi. What each
// direction carries, and what it leaves out on purpose, is pinned by the reflection
// round-trip tests (roundtrip_test.go): a field added to runtime.Spec or to SandboxSpec
// fails them until it is mapped or listed with the reason it is not.
package spec
