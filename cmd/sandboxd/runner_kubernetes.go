package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"

	corev1 "k8s.io/api/core/v1"

	"github.com/sandboxd/sandboxd/internal/stack"
)

// kubernetesFlags configure `sandboxd runner --backend kubernetes`.
type kubernetesFlags struct {
	kubeconfig, namespace, agentImage, pullPolicy string
}

func (k *kubernetesFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&k.kubeconfig, "kubeconfig", "", "kubernetes backend: kubeconfig file (default: the in-cluster configuration)")
	fs.StringVar(&k.namespace, "namespace", "sandboxd", "kubernetes backend: namespace of the sandbox Pods")
	fs.StringVar(&k.agentImage, "agent-image", "", "kubernetes backend: image holding /sandbox-agent and /sandbox-gate (test/k8s/imagetool builds one)")
	fs.StringVar(&k.pullPolicy, "image-pull-policy", "IfNotPresent", "kubernetes backend: imagePullPolicy of the sandbox and agent images (Always, IfNotPresent, Never)")
}

func (k *kubernetesFlags) start(ctx context.Context, runnerID, dataDir string, log *slog.Logger) (*stack.KubernetesStack, error) {
	if k.agentImage == "" {
		return nil, fmt.Errorf("--backend kubernetes needs --agent-image")
	}
	switch p := corev1.PullPolicy(k.pullPolicy); p {
	case corev1.PullAlways, corev1.PullIfNotPresent, corev1.PullNever:
	default:
		return nil, fmt.Errorf("--image-pull-policy %q: want Always, IfNotPresent or Never", k.pullPolicy)
	}
	return stack.NewKubernetes(ctx, stack.KubernetesConfig{
		Kubeconfig: k.kubeconfig, Namespace: k.namespace, RunnerID: runnerID, AgentImage: k.agentImage,
		ImagePullPolicy: corev1.PullPolicy(k.pullPolicy), DataDir: dataDir, Logger: log,
	})
}
