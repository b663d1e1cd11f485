package archtest

import (
	"strings"
	"testing"
)

// testOnly are helpers for tests: test images, test environments, throwaway databases.
// No server code path may reach them: `sandboxd dev` (and `sandboxd demo`) may, being
// the single-machine demo, so cmd/sandboxd is checked function by function (funcRules).
var testOnly = []string{
	"internal/testimage",
	"internal/testenv",
	"internal/testbed",
	"internal/pgtest",
	"internal/connecttest",
	"internal/gateway/gatewaytest",
	"internal/runtime/runtimetest",
	"internal/stack/stacktest",
	"internal/egress/egresstest",
}

// runnerSide is what runs in a runner process (beside the backends' own processes).
var runnerSide = []string{
	"internal/runner",
	"internal/runnerapi",
	"internal/dataplane",
	"internal/runtime/...",
	"internal/agent",
	"internal/edge",
	"internal/egress",
	"internal/enroll",
	"internal/stack",
}

var rules = []rule{
	{
		name:   "runner side never imports the gateway",
		why:    "runner and gateway are separate processes; what both need lives below both",
		from:   runnerSide,
		forbid: []string{"internal/gateway/..."},
	},
	{
		name: "sandbox-agent pulls only what it needs",
		why:  "the agent is PID 1 of every container, in images we do not control: small, static, no Kubernetes client, no store, no gateway",
		from: []string{"cmd/sandbox-agent"},
		forbid: []string{
			"k8s.io/...", "sigs.k8s.io/...", "internal/store/...", "internal/gateway/...", "internal/controlplane/...",
			"github.com/jackc/...", "modernc.org/...",
		},
		// Beside the standard library, exactly these (add one only if the agent needs it).
		only: []string{
			"internal/agent", "internal/agentconfig", "internal/apierr", "internal/errdefs", "internal/logstore", "internal/reserved", "internal/runtime",
			"gen/sandboxd/agent/v1", "gen/sandboxd/agent/v1/agentv1connect",
			"connectrpc.com/connect/...", "github.com/creack/pty", "golang.org/x/sys/unix",
			"google.golang.org/protobuf/...", "google.golang.org/genproto/googleapis/rpc/errdetails",
		},
	},
	{
		name:   "test helpers are reachable only from tests",
		why:    "test images and environments must never serve or run in a server",
		from:   []string{"..."},
		except: append([]string{"test/...", "bench/...", "cmd/sandboxd"}, testOnly...),
		forbid: testOnly,
	},
}

var funcRules = []funcRule{
	{
		name: "test images are a `sandboxd dev` convenience",
		why: "only dev (and demo), the single-machine demo, may serve test images as docker.io; " +
			"a runner, gateway or control plane never links that code into its path",
		pkg:    "cmd/sandboxd",
		roots:  []string{"runnerCmd", "gatewayCmd", "controlPlaneCmd", "apikey"},
		forbid: testOnly,
	},
	{
		name:   "the runner process never runs gateway code",
		why:    "runner and gateway are separate processes; what both need lives below both",
		pkg:    "cmd/sandboxd",
		roots:  []string{"runnerCmd"},
		forbid: []string{"internal/gateway/..."},
	},
}

// allowList holds today's violations. Whoever removes one deletes its entry (a stale
// entry fails the test); nobody adds one except for a step of issue 17 still to come.
var allowList = []allowed{
	{"internal/runnerapi", "internal/gateway", 2,
		"Capacity, LocalRunner, Runner, EffectiveNetwork move to internal/runner; Platform, PolicySource to internal/policy"},
	{"internal/dataplane", "internal/gateway", 2,
		"LocalRunner, Runner move to internal/runner; Relay, DataSource, LogReader, MaxMessageBytes to internal/relay; DataPlaneIssuer with them"},
	{"cmd/sandboxd.runnerCmd", "internal/gateway", 2,
		"runnerCmd and runnerStatus use gateway.NewLocalRunner / *gateway.LocalRunner, which move to internal/runner"},
	{"cmd/sandboxd.runnerCmd", "internal/gateway/placement", 2,
		"capacityFlags.parse bounds --cpu-overcommit by placement.MaxCPUOvercommit: runner admission and capacity move to internal/runner"},
}

// TestDependencyRules checks the rules against the module's import graph (linux/amd64,
// where the servers run).
func TestDependencyRules(t *testing.T) {
	g := goList(t, []string{"GOOS=linux", "GOARCH=amd64"}, mod+"/...")
	for path, p := range g {
		if p.Error != nil && !p.Standard {
			t.Errorf("go list %s: %s", path, p.Error.Err)
		}
	}
	for _, p := range audit(g, rules, funcRules, allowList) {
		t.Error(p)
	}
}

// TestAgentBuildsWithoutCgo: sandbox-agent builds with CGO_ENABLED=0 (Makefile `agent`,
// scripts/build-runner-image.sh) for linux/amd64 and linux/arm64 (the image builder takes
// any GOARCH), and none of its dependencies has cgo files it would lose by that.
func TestAgentBuildsWithoutCgo(t *testing.T) {
	for _, arch := range []string{"amd64", "arm64"} {
		g := goList(t, []string{"GOOS=linux", "GOARCH=" + arch, "CGO_ENABLED=0"}, mod+"/cmd/sandbox-agent")
		for path, p := range g {
			if p.Error != nil {
				t.Errorf("CGO_ENABLED=0 GOARCH=%s: %s: %s", arch, path, p.Error.Err)
			}
		}
	}
	g := goList(t, []string{"GOOS=linux", "GOARCH=amd64", "CGO_ENABLED=1"}, mod+"/cmd/sandbox-agent")
	var cgo []string
	for path, p := range g {
		if !p.Standard && len(p.CgoFiles) > 0 {
			cgo = append(cgo, path)
		}
	}
	if len(cgo) > 0 {
		t.Errorf("sandbox-agent depends on packages with cgo files: %s", strings.Join(cgo, ", "))
	}
}
