// Command sandboxd is the sandboxd server. Subcommands:
//
//	sandboxd dev     control plane + gateway + local runner in one process, on loopback
//	sandboxd controlplane the control plane: admin API and runner registration over TLS
//	sandboxd runner  a local runner serving gateways over mTLS
//	sandboxd gateway the API, with runners in other processes
//	sandboxd apikey  create API keys in the store (DATA-DIR/sandboxd.db or --store DSN)
//	sandboxd demo    run a first sandbox on this machine through the local runner
//	sandboxd release sign release manifests: keygen, manifest, sign, verify
//	sandboxd version print the version
package main

import (
	"fmt"
	"os"

	"github.com/sandboxd/sandboxd/internal/selfupdate"
	buildversion "github.com/sandboxd/sandboxd/internal/version"
)

// version is this binary's (internal/version): what `sandboxd version` prints, what a
// runner reports in its heartbeats and what the control plane offers as the target.
var version = buildversion.String()

func main() {
	if len(os.Args) < 2 {
		usage()
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "dev":
		err = dev(os.Args[2:])
	case "controlplane", "control-plane":
		err = controlPlaneCmd(os.Args[2:])
	case "runner":
		err = runnerCmd(os.Args[2:])
	case selfupdate.CheckFlagsCommand:
		// Unlisted: a runner's self-update asks the new sandboxd whether it accepts the
		// runner's flags before swapping it in (internal/selfupdate).
		err = runnerCheckFlags(os.Args[2:])
	case "gateway":
		err = gatewayCmd(os.Args[2:])
	case "node-agent":
		err = nodeAgentCmd(os.Args[2:])
	case "apikey":
		err = apikey(os.Args[2:])
	case "registry":
		err = registryCmd(os.Args[2:], os.Stdout)
	case "secret-key":
		err = secretKeyCmd(os.Args[2:], os.Stdout)
	case "demo":
		err = demo(os.Args[2:])
	case "release":
		err = releaseCmd(os.Args[2:], os.Stdout)
	case "version", "--version":
		fmt.Println("sandboxd", version)
	case "help", "-h", "--help":
		usage()
	default:
		fmt.Fprintf(os.Stderr, "sandboxd: unknown command %q\n", os.Args[1])
		usage()
		os.Exit(2)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "sandboxd:", err)
		os.Exit(1)
	}
}

func usage() {
	fmt.Fprint(os.Stderr, `usage: sandboxd <command> [flags]

commands:
  dev       run the control plane, the gateway and a local runner in one process (loopback by default;
            state in DATA-DIR/sandboxd.db, or --store postgres://…)
  controlplane  run the control plane (admin API, runner registration and heartbeats) over TLS:
            controlplane --data-dir D --listen ADDR [--store DSN]
  runner    run a local runner for gateways, registered with the control plane:
            runner --data-dir D --listen ADDR --control-plane ADDR --bootstrap-token T (first start)
            or with a shared CA: runner --data-dir D --pki-dir P --listen ADDR --runner-id ID
  gateway   run the API and the control plane over runners elsewhere:
            gateway --data-dir D [--store DSN] --pki-dir P --listen ADDR --runner ID=ADDR… [--control-plane ADDR]
  node-agent  run the node agent of a Kubernetes runner on a gVisor node (checkpoints for pause/fork):
            node-agent --node N --runner-id ID --namespace NS [--shim-root … --checkpoint-root … --tls-dir …]
  apikey    create an API key: apikey create --data-dir DIR [--store DSN] --org ORG [--role user|admin]
  registry  registry gc --data-dir D [--store DSN] [--blob-s3-* …]: delete the platform registry's images
            no template and no live sandbox names now (what the gateways do every --registry-gc-interval)
  secret-key  secret-key status|rotate|reseal|prune [--secret-key-file F | --data-dir D | --pki-dir P] [--store DSN]:
            rotate the built-in secret stores' key ring (a new key, every value re-encrypted under it)
  demo      start the single-host runtime and run a first sandbox
  release   signed release manifests: release keygen|manifest|sign|verify (see sandboxd release)
  version   print the version
`)
}
