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
// wire (sandboxd.runner.v1) has its own conversion in runnerapi, which carries every
// field but the gaps its TestSpecWireRoundTrip lists. What each direction here
// carries, and what it leaves out on purpose, is pinned by reflection tests in the
// manner of Tailscale's ipn/prefs_test.go: a field added to runtime.Spec
// (TestForPolicyRoundTrip) or to the public SandboxSpec (TestWireFieldsConverted) fails
// them until it is mapped or listed with the reason it is not.
package spec
