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
	"internal/testenv/...", // with internal/testenv/logbuf
	"internal/testbed",
	"internal/pgtest",
	"internal/connecttest",
	"internal/gateway/gatewaytest",
	"internal/runtime/runtimetest",
	"internal/stack/stacktest",
	"internal/egress/egresstest",
	"internal/buildfake",
}

// runnerSide is what runs in a runner process (beside the backends' own processes).
var runnerSide = []string{
	"internal/runner",
	"internal/runnerapi",
	"internal/dataplane",
	"internal/relay",
	"internal/runtime/...", // with internal/runtime/kubernetes/nodeagentdial, the runner's side of the node agent
	"internal/agent",
	"internal/edge",
	"internal/egress",
	"internal/enroll",
	"internal/selfupdate",
	"internal/stack",
	"internal/spec", // spec conversion: used by runnerapi as well as the gateway
}

// shared is what both sides use, so that runner and gateway decide alike: the placement
// arithmetic (the gateway's placement and the runner's own admission) and the policy
// resolution.
var shared = []string{
	"internal/placement",
	"internal/policy",
}

// nodeAgentRule names the node agent's rule (TestNodeAgentRule).
const nodeAgentRule = "the node agent never imports the runner, the gateway or the store"

var rules = []rule{
	{
		name:   "runner side never imports the gateway",
		why:    "runner and gateway are separate processes; what both need lives below both",
		from:   runnerSide,
		forbid: []string{"internal/gateway/...", "internal/console/..."},
	},
	{
		name:   "what both sides share never imports the gateway",
		why:    "the runner uses it too, and would link the gateway through it",
		from:   shared,
		forbid: []string{"internal/gateway/...", "internal/console/..."},
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
		// internal/fsarchive (and its zstd): the agent archives and restores the scratch
		// volumes of Kubernetes sandboxes (AgentService.ArchivePath, ExtractPath).
		only: []string{
			"internal/agent", "internal/agentconfig", "internal/apierr", "internal/errdefs", "internal/logstore", "internal/reserved", "internal/runtime", "internal/textclip",
			"internal/fsarchive", "github.com/klauspost/compress/...",
			"gen/sandboxd/agent/v1", "gen/sandboxd/agent/v1/agentv1connect",
			"connectrpc.com/connect/...", "github.com/creack/pty", "golang.org/x/sys/unix",
			"google.golang.org/protobuf/...", "google.golang.org/genproto/googleapis/rpc/errdetails",
		},
	},
	{
		name: "sandbox-gate pulls only what it needs",
		why: "the gate runs in every Kubernetes sandbox Pod (installs the agent and the egress CA bundle, fronts the agent): " +
			"small and static; shared code it needs lives in leaves (internal/atomicfile, internal/egress/cabundle), never the egress proxy",
		from: []string{"internal/runtime/kubernetes/cmd/sandbox-gate"},
		// Beside the standard library, exactly these (add one only if the gate needs it).
		only: []string{"internal/runtime/kubernetes/gate", "internal/agentconfig", "internal/atomicfile", "internal/egress/cabundle"},
	},
	{
		name: "the Go SDK stays a client",
		why: "sdk/go is imported by users' programs: it links the generated API and the archive " +
			"format it writes (internal/fsarchive, Linux only, for build contexts), no server code",
		from: []string{"sdk/go"},
		forbid: []string{
			"internal/gateway/...", "internal/store/...", "internal/runner/...", "internal/controlplane/...", "internal/agent/...",
			"k8s.io/...", "sigs.k8s.io/...", "github.com/jackc/...", "modernc.org/...",
		},
	},
	{
		name: nodeAgentRule,
		why: "the node agent (sandboxd node-agent) is a separate process on every node, trusted by no runner beyond its mTLS: " +
			"the runner's side of it (the dialer, the Kubernetes backend's adapter) lives in internal/runtime/kubernetes/nodeagentdial, " +
			"and the agent links none of the backends, the runner or the stack, nor the gateway, the console, the control plane " +
			"or the store (a daemon with host access on every node holds no API or database code). internal/runtime itself " +
			"(ValidID, the restore annotation: the contract both sides share, which imports none of its backends) is allowed",
		from: []string{"internal/nodeagent/..."},
		forbid: []string{
			"internal/runtime/kubernetes/...", "internal/runtime/local/...", "internal/runtime/startseq/...",
			"internal/runner/...", "internal/runnerapi/...", "internal/stack/...",
			"internal/gateway/...", "internal/console/...", "internal/controlplane/...", "internal/store/...",
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

// allowList holds known violations, each naming the issue-17 step that removes it. It
// is empty since step 2 landed: a new violation is fixed, not listed (a stale entry
// fails the test, so the list only shrinks).
var allowList = []allowed{}

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
