package k8s

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sclient "k8s.io/client-go/kubernetes"

	"github.com/sandboxd/sandboxd/internal/nodeagent/hibernate"
	"github.com/sandboxd/sandboxd/internal/runtime/kubernetes"
)

// localAgent is a test-only kubernetes.NodeAgent (and NodeAgentDialer) for the one node of
// the test cluster, run in the test process as root: it does what the node agent
// (internal/nodeagent) will, without CRI — it resolves the Pod's sandbox ID from
// containerd's state dir as TestGVisorCheckpointRestore does (podSandboxID), then
// hibernate CreateImageDir, Checkpoint through the shim's hibernate socket and
// MarkComplete.
type localAgent struct {
	client   k8sclient.Interface
	dataDir  string // the cluster's data dir (containerd's state below it)
	hibDir   string // the shim's hibernate sockets
	ckptRoot string // where the shim restores from

	mu   sync.Mutex
	made map[string]bool // checkpoint IDs taken and not deleted
}

func newLocalAgent(client k8sclient.Interface) *localAgent {
	dataDir := env("SANDBOXD_K8S_DIR", "/var/lib/sandboxd-k8s")
	return &localAgent{
		client:   client,
		dataDir:  dataDir,
		hibDir:   env("SANDBOXD_K8S_HIBERNATE_DIR", filepath.Join(dataDir, "hib")),
		ckptRoot: env("SANDBOXD_K8S_CHECKPOINT_ROOT", filepath.Join(dataDir, "checkpoints")),
		made:     map[string]bool{},
	}
}

func (a *localAgent) Agent(_ context.Context, node string) (kubernetes.NodeAgent, error) {
	if node == "" {
		return nil, errors.New("no node")
	}
	return a, nil
}

// runningContainer returns the Pod asked for and the containerd ID of one of its running
// containers. The sandbox can be RUNNING (its agent answered through the gate) before the
// kubelet has posted the container statuses with their IDs (its status manager writes
// them asynchronously): a clean CI run once paused in that window and saw an empty ID.
// So it waits, bounded, for an ID; the real node agent asks CRI and has no such window.
func (a *localAgent) runningContainer(ctx context.Context, req kubernetes.NodeCheckpointRequest) (*corev1.Pod, string, error) {
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	for {
		pod, err := a.client.CoreV1().Pods(req.Namespace).Get(ctx, req.Name, metav1.GetOptions{})
		if err != nil {
			return nil, "", err
		}
		if string(pod.UID) != req.UID || pod.Labels[kubernetes.LabelSandbox] != req.SandboxID {
			return nil, "", fmt.Errorf("pod %s/%s is not the one asked for", req.Namespace, req.Name)
		}
		for _, cs := range append(append([]corev1.ContainerStatus(nil), pod.Status.ContainerStatuses...), pod.Status.InitContainerStatuses...) {
			cid, ok := strings.CutPrefix(cs.ContainerID, "containerd://")
			if ok && cs.State.Running != nil && hibernate.ValidContainerID(cid) == nil {
				return pod, cid, nil
			}
		}
		select {
		case <-ctx.Done():
			return nil, "", errors.New("no running container with an ID in the Pod's status")
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func (a *localAgent) Checkpoint(ctx context.Context, req kubernetes.NodeCheckpointRequest) (kubernetes.NodeCheckpoint, error) {
	pod, cid, err := a.runningContainer(ctx, req)
	if err != nil {
		return kubernetes.NodeCheckpoint{SandboxRunning: true}, err
	}
	b, err := os.ReadFile(filepath.Join(a.dataDir, "containerd", "state", "io.containerd.runtime.v2.task", "k8s.io", cid, "config.json"))
	if err != nil {
		return kubernetes.NodeCheckpoint{SandboxRunning: true}, err
	}
	var spec struct {
		Annotations map[string]string `json:"annotations"`
	}
	if err := json.Unmarshal(b, &spec); err != nil {
		return kubernetes.NodeCheckpoint{SandboxRunning: true}, err
	}
	sandboxID := spec.Annotations["io.kubernetes.cri.sandbox-id"]
	if err := hibernate.ValidContainerID(sandboxID); err != nil {
		return kubernetes.NodeCheckpoint{SandboxRunning: true}, err
	}
	sock, err := hibernate.SocketPath(a.hibDir, sandboxID)
	if err != nil {
		return kubernetes.NodeCheckpoint{SandboxRunning: true}, err
	}
	var rnd [10]byte
	_, _ = rand.Read(rnd[:])
	id := "e2e-p-" + hex.EncodeToString(rnd[:])
	dir, err := hibernate.CreateImageDir(a.ckptRoot, id)
	if err != nil {
		return kubernetes.NodeCheckpoint{SandboxRunning: true}, err
	}
	hc, err := hibernate.Dial(ctx, sock)
	if err != nil {
		_ = os.RemoveAll(dir)
		return kubernetes.NodeCheckpoint{SandboxRunning: true}, err
	}
	defer hc.Close()
	t0 := time.Now()
	if err := hc.Checkpoint(ctx, hibernate.CheckpointRequest{ContainerID: sandboxID, ImagePath: dir, LeaveRunning: req.LeaveRunning}); err != nil {
		_ = os.RemoveAll(dir)
		return kubernetes.NodeCheckpoint{SandboxRunning: req.LeaveRunning}, err
	}
	took := time.Since(t0)
	if err := hibernate.MarkComplete(dir); err != nil {
		_ = os.RemoveAll(dir)
		return kubernetes.NodeCheckpoint{}, err
	}
	var size int64
	_ = filepath.WalkDir(dir, func(_ string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			if fi, err := d.Info(); err == nil {
				size += fi.Size()
			}
		}
		return nil
	})
	a.mu.Lock()
	a.made[id] = true
	a.mu.Unlock()
	return kubernetes.NodeCheckpoint{ID: id, Node: pod.Spec.NodeName, Bytes: size, Took: took, SandboxRunning: req.LeaveRunning}, nil
}

func (a *localAgent) DeleteCheckpoint(_ context.Context, id string) error {
	if err := hibernate.ValidCheckpointID(id); err != nil {
		return err
	}
	dir, err := hibernate.ImageDir(a.ckptRoot, id)
	if err != nil {
		return err
	}
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	a.mu.Lock()
	delete(a.made, id)
	a.mu.Unlock()
	return nil
}

// cleanup removes every image the agent took and nobody deleted.
func (a *localAgent) cleanup() {
	a.mu.Lock()
	defer a.mu.Unlock()
	for id := range a.made {
		if dir, err := hibernate.ImageDir(a.ckptRoot, id); err == nil {
			_ = os.RemoveAll(dir)
		}
	}
}

var _ kubernetes.NodeAgentDialer = (*localAgent)(nil)
