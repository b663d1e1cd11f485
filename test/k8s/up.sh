#!/usr/bin/env bash
# Brings up a one-node Kubernetes cluster on this host for the Kubernetes backend's tests:
# etcd (Debian etcd-server), kube-apiserver, kube-controller-manager, kube-scheduler, kubelet
# and kube-proxy (built from the Go module proxy by build.sh, cached by version) on
# containerd (Debian) with the CRI plugin and the Debian CNI plugins (bridge + host-local).
# Everything lives under $SANDBOXD_K8S_DIR (default /var/lib/sandboxd-k8s); down.sh
# removes every trace. Needs root. Prints the kubeconfig path on stdout.
#
# The test images (busybox, python), the pause image, the agent image (sandbox-agent +
# sandbox-gate) and the runner image (static sandboxd; scripts/build-runner-image.sh) are
# imported into containerd's k8s.io namespace; Pods must use imagePullPolicy: Never (no
# registry is reachable). containerd's CRI reads per-registry hosts.toml files from
# $DATA/containerd/certs.d (config_path): a test that serves a registry on the node's
# loopback over plain HTTP (TestPlatformRegistryPull) writes certs.d/HOST:PORT/hosts.toml
# with `server = "http://HOST:PORT"` for its lifetime; nothing else is configured there.
set -euo pipefail
cd "$(dirname "$0")/../.."
REPO=$PWD
[ "$(id -u)" = 0 ] || { echo "up.sh: run as root" >&2; exit 1; }

DATA=${SANDBOXD_K8S_DIR:-/var/lib/sandboxd-k8s}
K8S_VERSION=${K8S_VERSION:-v1.32.13}
ETCD_PORT=${SANDBOXD_K8S_ETCD_PORT:-23790}
API_PORT=${SANDBOXD_K8S_API_PORT:-6443}
POD_CIDR=${SANDBOXD_K8S_POD_CIDR:-10.214.0.0/24}
SVC_CIDR=${SANDBOXD_K8S_SERVICE_CIDR:-10.214.128.0/24}
BRIDGE=${SANDBOXD_K8S_BRIDGE:-sbxk8s0}
NAMESPACE=${SANDBOXD_K8S_NAMESPACE:-sandboxd}
AGENT_REF=${SANDBOXD_K8S_AGENT_IMAGE:-localhost/sandboxd/agent:dev}
RUNNER_REF=${SANDBOXD_K8S_RUNNER_IMAGE:-localhost/sandboxd/runner:dev}
CGROUP_ROOT=sandboxd-k8s
NODE=$(hostname | tr 'A-Z_' 'a-z-')

t0=$(date +%s.%N)
ms() { awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN{printf "%d", (b-a)*1000}'; }
log() { echo "k8s up [$(ms) ms]: $*" >&2; }
fail() { echo "k8s up: $*" >&2; exit 1; }
pidfile() { echo "$DATA/run/$1.pid"; }
running() { [ -s "$(pidfile "$1")" ] && kill -0 "$(cat "$(pidfile "$1")")" 2>/dev/null; }
start() { # name cmd... : background daemon, log and pid file in $DATA
  local name=$1; shift
  "$@" >"$DATA/log/$name.log" 2>&1 &
  echo $! >"$(pidfile "$name")"
}
wait_for() { # seconds description cmd...
  local n=$1 what=$2; shift 2
  local end=$(( $(date +%s) + n ))
  until "$@" >/dev/null 2>&1; do
    [ "$(date +%s)" -lt "$end" ] || fail "timed out waiting for $what (logs: $DATA/log)"
    sleep 0.2
  done
}

# --- images (in the background while the control plane starts; again on a cluster that
# is up, so a rebuilt agent reaches it) -----------------------------------------------
import_images() {
  # The runner image (static sandboxd) and the agent image, as a user builds them; the runner
  # again as :update-test, built as that version: TestChartRunner's runner rolls itself to it
  # and then reports it.
  BIN_DIR="$DATA/bin" RUNNER_IMAGE=$RUNNER_REF AGENT_IMAGE=$AGENT_REF VERSION=dev \
    bash scripts/build-runner-image.sh -out "$DATA/images"
  mkdir -p "$DATA/images/update"
  BIN_DIR="$DATA/bin/update" RUNNER_IMAGE=${RUNNER_REF%:*}:update-test AGENT_IMAGE='' VERSION=update-test \
    bash scripts/build-runner-image.sh -out "$DATA/images/update"
  go run ./test/k8s/imagetool -out "$DATA/images"
  for f in pause busybox busybox-workdir busybox-deepworkdir python agent runner update/runner; do
    "${CTR[@]}" images import "$DATA/images/$f.tar" >/dev/null
  done
  # A second tag of the same image: TestApplyAvailableUpdate rolls a stand-in Deployment to it.
  "${CTR[@]}" images tag --force localhost/sandboxd/busybox:latest localhost/sandboxd/busybox:update-test >/dev/null
  rm -f "$DATA/images/"*.tar "$DATA/images/update/"*.tar
}
CTR=(ctr --address "$DATA/run/containerd.sock" -n k8s.io)
if running kube-apiserver && running kubelet && running containerd && running etcd && [ -s "$DATA/kubeconfig" ]; then
  import_images >"$DATA/log/images.log" 2>&1 || { cat "$DATA/log/images.log" >&2; fail "image build/import failed"; }
  log "already up; images imported again"
  echo "$DATA/kubeconfig"
  exit 0
fi
if [ -d "$DATA" ]; then # left by a crash or a reboot: start from a clean slate
  log "stale $DATA: running down.sh first"
  bash test/k8s/down.sh >&2
fi
for c in etcd containerd ctr curl openssl iptables nft; do
  command -v "$c" >/dev/null || fail "$c missing: bash scripts/install-deps.sh --k8s"
done
[ -x /usr/lib/cni/bridge ] || fail "CNI plugins missing (containernetworking-plugins)"

BIN=$(bash test/k8s/build.sh)
log "binaries in $BIN"

# gVisor: the `runsc` handler of the `gvisor` RuntimeClass (gVisor's containerd shim, patched
# for this VM's containerd 1.6: scripts/build-runsc-shim.sh; runsc itself from build-runsc.sh).
# Both cached, built here when absent.
RUNSC=$(bash scripts/build-runsc.sh)
RUNSC_SHIM=$(bash scripts/build-runsc-shim.sh)
log "gVisor: $RUNSC, $RUNSC_SHIM"

mkdir -p "$DATA"/{run,log,pki,etcd,containerd/root,containerd/state,containerd/certs.d,cni/net.d,cni/ipam,kubelet,pods,images,bin}
IP=$(ip -4 route get 1.1.1.1 2>/dev/null | awk '{for(i=1;i<NF;i++) if($i=="src"){print $(i+1); exit}}')
[ -n "$IP" ] || IP=$(hostname -I | awk '{print $1}')
[ -d /var/lib/kubelet ] || touch "$DATA/run/created-var-lib-kubelet"
[ -d /var/log/containers ] || touch "$DATA/run/created-var-log-containers"

# containerd 1.6 keeps shim sockets in /run/containerd/s whatever its state dir is.
[ -d /run/containerd ] || touch "$DATA/run/created-run-containerd"
echo "$BRIDGE" >"$DATA/run/bridge"

# --- containerd --------------------------------------------------------------------
cat >"$DATA/containerd/config.toml" <<TOML
version = 2
root = "$DATA/containerd/root"
state = "$DATA/containerd/state"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]
[grpc]
  address = "$DATA/run/containerd.sock"
[ttrpc]
  address = "$DATA/run/containerd.sock.ttrpc"
[debug]
  address = ""
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "localhost/sandboxd/pause:k8s"
  restrict_oom_score_adj = true
  enable_selinux = false
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "$DATA/run/runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runsc]
      runtime_type = "io.containerd.runsc.v1"
      pod_annotations = ["dev.gvisor.*", "dev.sandboxd.restore.checkpoint-id"]
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runsc.options]
        TypeUrl = "io.containerd.runsc.v1.options"
        ConfigPath = "$DATA/containerd/runsc.toml"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$DATA/cni/net.d"
  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = "$DATA/containerd/certs.d"
TOML
cat >"$DATA/containerd/runsc.toml" <<TOML
binary_name = "$RUNSC"
root = "$DATA/run/runsc"
[runsc_config]
  platform = "systrap"
  # A restored Pod's specs differ from the checkpointed one's in what the shim derives from
  # the Pod's UID (dev.gvisor.spec.cgroup-parent): runsc's strict check would refuse every
  # restore into a new Pod. Mismatches are logged instead.
  restore-spec-validation = "warning"
TOML
# The shim's own config (patched shim: $SANDBOXD_RUNSC_SHIM_CONFIG names it): each Pod's shim
# serves gVisor's hibernate task server (Checkpoint, Wait) on $DATA/hib/<sandbox
# id>_sandbox.sock (its `root`: a short dir, the socket path must fit a sockaddr_un's 107
# bytes with a 64-digit ID), and restores a container whose Pod has the annotation
# dev.sandboxd.restore.checkpoint-id=<id> from $DATA/checkpoints/<id> (0700, root's).
[ $(( ${#DATA} + 5 + 64 + 13 )) -le 107 ] || fail "data dir $DATA too long for the shim's hibernate sockets ($DATA/hib/<64 hex>_sandbox.sock > 107 bytes)"
cat >"$DATA/containerd/runsc-shim.toml" <<TOML
enable_hibernate_server = true
root = "$DATA/hib"
sandboxd_checkpoint_root = "$DATA/checkpoints"
TOML
mkdir -p -m 0700 "$DATA/hib" "$DATA/checkpoints"
chmod 0700 "$DATA/hib" "$DATA/checkpoints"
mkdir -p "$DATA/shim"
ln -sf "$RUNSC_SHIM" "$DATA/shim/containerd-shim-runsc-v1"
cat >"$DATA/cni/net.d/10-sandboxd.conflist" <<JSON
{
  "cniVersion": "0.4.0",
  "name": "sandboxd-k8s",
  "plugins": [
    {
      "type": "bridge", "bridge": "$BRIDGE", "isGateway": true, "ipMasq": false, "hairpinMode": true,
      "ipam": { "type": "host-local", "dataDir": "$DATA/cni/ipam", "ranges": [[{ "subnet": "$POD_CIDR" }]], "routes": [{ "dst": "0.0.0.0/0" }] }
    }
  ]
}
JSON
# The shim finds Pods' volumes under this kubelet's root (scripts/build-runsc-shim.sh).
start containerd env PATH="$DATA/shim:$PATH" SANDBOXD_KUBELET_PODS_DIR="$DATA/kubelet/pods" \
  SANDBOXD_RUNSC_SHIM_CONFIG="$DATA/containerd/runsc-shim.toml" containerd --config "$DATA/containerd/config.toml"
wait_for 20 containerd "${CTR[@]}" version
log "containerd ready"

[ -s "${SANDBOXD_CACHE:-/var/cache/sandboxd}/images/python.tar" ] || bash scripts/build-test-images.sh >&2
import_images >"$DATA/log/images.log" 2>&1 &
images_pid=$!

# --- certificates and tokens --------------------------------------------------------
openssl genrsa -out "$DATA/pki/sa.key" 2048 2>/dev/null
openssl rsa -in "$DATA/pki/sa.key" -pubout -out "$DATA/pki/sa.pub" 2>/dev/null
TOKEN=$(openssl rand -hex 24)
echo "$TOKEN,admin,admin,system:masters" >"$DATA/pki/tokens.csv"
chmod 600 "$DATA/pki/"*
KUBECONFIG_FILE=$DATA/kubeconfig
cat >"$KUBECONFIG_FILE" <<YAML
apiVersion: v1
kind: Config
clusters:
- name: sandboxd-k8s
  cluster:
    server: https://127.0.0.1:$API_PORT
    insecure-skip-tls-verify: true
users:
- name: admin
  user:
    token: $TOKEN
contexts:
- name: sandboxd-k8s
  context: {cluster: sandboxd-k8s, user: admin, namespace: $NAMESPACE}
current-context: sandboxd-k8s
YAML
chmod 600 "$KUBECONFIG_FILE"
api() { curl -sfk -H "Authorization: Bearer $TOKEN" "https://127.0.0.1:$API_PORT$1" "${@:2}"; }

# --- etcd + kube-apiserver ---------------------------------------------------------
start etcd etcd --name sandboxd-k8s --data-dir "$DATA/etcd" \
  --listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
  --listen-peer-urls "http://127.0.0.1:$((ETCD_PORT + 10))" --initial-advertise-peer-urls "http://127.0.0.1:$((ETCD_PORT + 10))" \
  --initial-cluster "sandboxd-k8s=http://127.0.0.1:$((ETCD_PORT + 10))" --log-level warn
wait_for 20 etcd curl -sf "http://127.0.0.1:$ETCD_PORT/health"
log "etcd healthy"
start kube-apiserver "$BIN/kube-apiserver" --etcd-servers "http://127.0.0.1:$ETCD_PORT" \
  --cert-dir "$DATA/pki/apiserver" --secure-port "$API_PORT" --bind-address 0.0.0.0 --advertise-address "$IP" \
  --service-account-issuer https://kubernetes.default.svc --service-account-key-file "$DATA/pki/sa.pub" \
  --service-account-signing-key-file "$DATA/pki/sa.key" --service-cluster-ip-range "$SVC_CIDR" \
  --token-auth-file "$DATA/pki/tokens.csv" --authorization-mode RBAC --kubelet-preferred-address-types InternalIP \
  --enable-priority-and-fairness=false
wait_for 60 kube-apiserver api /readyz
log "apiserver ready"
# The apiserver's self-signed certificate (it generated it in --cert-dir: SANs the node IP,
# the `kubernetes` Service IP and names) is the cluster CA Pods trust: the controller
# manager publishes it as kube-root-ca.crt, mounted with every service-account token.
[ -s "$DATA/pki/apiserver/apiserver.crt" ] || fail "no apiserver certificate in $DATA/pki/apiserver"

start kube-controller-manager "$BIN/kube-controller-manager" --kubeconfig "$KUBECONFIG_FILE" \
  --service-account-private-key-file "$DATA/pki/sa.key" --root-ca-file "$DATA/pki/apiserver/apiserver.crt" --leader-elect=false --use-service-account-credentials=false \
  --bind-address 127.0.0.1 --secure-port 0
start kube-scheduler "$BIN/kube-scheduler" --kubeconfig "$KUBECONFIG_FILE" --leader-elect=false \
  --bind-address 127.0.0.1 --secure-port 0

# --- kubelet ------------------------------------------------------------------------
for d in /sys/fs/cgroup/*/; do
  [ -d "$d" ] && [ "$(basename "$d")" != unified ] || continue
  mkdir -p "$d$CGROUP_ROOT" 2>/dev/null || true
done
mkdir -p "/sys/fs/cgroup/unified/$CGROUP_ROOT" 2>/dev/null || true
cat >"$DATA/kubelet/config.yaml" <<YAML
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: 0.0.0.0
cgroupDriver: cgroupfs
cgroupRoot: /$CGROUP_ROOT
containerRuntimeEndpoint: unix://$DATA/run/containerd.sock
failSwapOn: false
oomScoreAdj: 0
podLogsDir: $DATA/pods
healthzPort: 0
readOnlyPort: 0
registerNode: true
authentication:
  anonymous: {enabled: true}
  webhook: {enabled: false}
authorization: {mode: AlwaysAllow}
evictionHard: {memory.available: "50Mi", nodefs.available: "1%", imagefs.available: "1%", nodefs.inodesFree: "1%"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
localStorageCapacityIsolation: false
maxPods: 250
# Each Pod's pids cgroup (the Pod spec cannot set one): runtime.DefaultPidsLimit, the local
# backend's per-sandbox limit. Contains a fork bomb in a sandbox (TestForkBomb).
podPidsLimit: 4096
YAML
# The node registers labelled as a gVisor node (runsc, its shim and the RuntimeClass gvisor
# are set up above): the label the runner chart's node agent DaemonSet selects by default
# (nodeAgent.nodeSelector; TestChartPauseResume).
start kubelet "$BIN/kubelet" --config "$DATA/kubelet/config.yaml" --kubeconfig "$KUBECONFIG_FILE" \
  --root-dir "$DATA/kubelet" --hostname-override "$NODE" --node-ip "$IP" --node-labels sandboxd.dev/gvisor=true --v 1
# kube-proxy (nftables mode: its own `kube-proxy` tables, nothing in iptables' chains) makes
# Service IPs work for Pods and this host, above all the `kubernetes` Service that
# in-cluster clients (client-go's InClusterConfig) use: the apiserver keeps its endpoint
# (the node IP, lease reconciler). No masquerade of Pod traffic (--cluster-cidr); conntrack
# sysctls left alone (--conntrack-max-per-core 0).
start kube-proxy "$BIN/kube-proxy" --kubeconfig "$KUBECONFIG_FILE" --proxy-mode nftables --hostname-override "$NODE" \
  --cluster-cidr "$POD_CIDR" --conntrack-max-per-core 0 --metrics-bind-address 127.0.0.1:10249 \
  --healthz-bind-address 127.0.0.1:10256 --v 1
node_ready() { api "/api/v1/nodes/$NODE" | tr -d ' \n' | grep -q '"type":"Ready","status":"True"'; }
wait_for 60 "node Ready" node_ready
log "node $NODE Ready"
# Pod Security admission (on by default) enforces "baseline" on the sandboxes' namespace,
# the level sandbox Pods meet (docs/hardening.md): every test's sandbox is admitted under it.
api /api/v1/namespaces -X POST -H 'Content-Type: application/json' \
  -d "{\"apiVersion\":\"v1\",\"kind\":\"Namespace\",\"metadata\":{\"name\":\"$NAMESPACE\",\"labels\":{\"pod-security.kubernetes.io/enforce\":\"baseline\"}}}" >/dev/null || true
wait_for 60 "default service account" api "/api/v1/namespaces/$NAMESPACE/serviceaccounts/default"
log "namespace $NAMESPACE has its default service account"
# The gVisor RuntimeClass (handler runsc, above): sandboxes of the `gvisor` runtime class.
api /apis/node.k8s.io/v1/runtimeclasses -X POST -H 'Content-Type: application/json' \
  -d '{"apiVersion":"node.k8s.io/v1","kind":"RuntimeClass","metadata":{"name":"gvisor"},"handler":"runsc"}' >/dev/null || true
# The `kubernetes` Service answers through kube-proxy's rules (Pods reach it the same way),
# with a certificate that verifies against the CA Pods get, for the Service IP.
svc_ip=$(api /api/v1/namespaces/default/services/kubernetes | tr -d ' \n' | sed -n 's/.*"clusterIP":"\([^"]*\)".*/\1/p')
[ -n "$svc_ip" ] || fail "no kubernetes Service"
wait_for 60 "the kubernetes Service at $svc_ip:443 (kube-proxy)" curl -sf --cacert "$DATA/pki/apiserver/apiserver.crt" -H "Authorization: Bearer $TOKEN" "https://$svc_ip/readyz"
log "kube-proxy: the kubernetes Service answers at $svc_ip"
wait "$images_pid" || { cat "$DATA/log/images.log" >&2; fail "image build/import failed"; }
log "images imported: $("${CTR[@]}" images ls -q | grep -c '^localhost/') (pause, busybox, busybox:workdir, busybox:deepworkdir, python, agent $AGENT_REF, runner $RUNNER_REF)"
cat >"$DATA/env" <<ENV
SANDBOXD_K8S_KUBECONFIG=$KUBECONFIG_FILE
SANDBOXD_K8S_NAMESPACE=$NAMESPACE
SANDBOXD_K8S_AGENT_IMAGE=$AGENT_REF
SANDBOXD_K8S_RUNNER_IMAGE=$RUNNER_REF
SANDBOXD_K8S_CONTAINERD=$DATA/run/containerd.sock
SANDBOXD_K8S_HIBERNATE_DIR=$DATA/hib
SANDBOXD_K8S_CHECKPOINT_ROOT=$DATA/checkpoints
ENV
log "up (kubeconfig $KUBECONFIG_FILE)"
echo "$KUBECONFIG_FILE"
