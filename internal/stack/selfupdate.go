package stack

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	k8s "k8s.io/client-go/kubernetes"

	"github.com/sandboxd/sandboxd/internal/release"
)

// SelfUpdater rolls the runner's own Deployment to another version: the control plane's
// :applyAvailableUpdate sets a runner's desired version, the heartbeat reply carries it,
// and the runner sets its container's image tag to it. The Deployment (strategy Recreate)
// then replaces the runner's Pod; sandboxes keep running and are re-adopted.
type SelfUpdater struct {
	Client     k8s.Interface
	Namespace  string
	Deployment string
	// Container is the runner's container in the Deployment; "" = the first.
	Container string
	Logger    *slog.Logger
}

// WithTag is ref with its tag replaced by tag (a digest is dropped: it pins the old one):
// release.ImageWithTag.
func WithTag(ref, tag string) string { return release.ImageWithTag(ref, tag) }

// Apply sets the runner container's image tag to version. It reports whether it changed
// the Deployment (false when it already asks for that image).
func (u *SelfUpdater) Apply(ctx context.Context, version string) (bool, error) {
	if version == "" || strings.ContainsAny(version, ":/@ ") {
		return false, fmt.Errorf("self-update: %q is not an image tag", version)
	}
	d, err := u.Client.AppsV1().Deployments(u.Namespace).Get(ctx, u.Deployment, metav1.GetOptions{})
	if err != nil {
		return false, fmt.Errorf("self-update: deployment %s/%s: %w", u.Namespace, u.Deployment, err)
	}
	cs := d.Spec.Template.Spec.Containers
	i := 0
	if u.Container != "" {
		for i = 0; i < len(cs) && cs[i].Name != u.Container; i++ {
		}
	}
	if i >= len(cs) {
		return false, fmt.Errorf("self-update: deployment %s/%s has no container %q", u.Namespace, u.Deployment, u.Container)
	}
	image := WithTag(cs[i].Image, version)
	if image == cs[i].Image {
		return false, nil
	}
	// Strategic merge on the container list (keyed by name), guarded by the version of
	// the Deployment read: a concurrent edit makes this fail rather than be overwritten.
	patch, err := json.Marshal(map[string]any{
		"metadata": map[string]any{"resourceVersion": d.ResourceVersion},
		"spec": map[string]any{"template": map[string]any{"spec": map[string]any{
			"containers": []map[string]string{{"name": cs[i].Name, "image": image}},
		}}},
	})
	if err != nil {
		return false, err
	}
	if _, err := u.Client.AppsV1().Deployments(u.Namespace).Patch(ctx, u.Deployment, types.StrategicMergePatchType, patch, metav1.PatchOptions{}); err != nil {
		return false, fmt.Errorf("self-update: patch deployment %s/%s: %w", u.Namespace, u.Deployment, err)
	}
	u.logger().Info("runner update: deployment rolled to a new image", "deployment", u.Namespace+"/"+u.Deployment, "from", cs[i].Image, "to", image)
	return true, nil
}

func (u *SelfUpdater) logger() *slog.Logger {
	if u.Logger == nil {
		return slog.Default()
	}
	return u.Logger
}

// Run applies desired() every interval until ctx ends, when it names a version other than
// running; failures are logged and retried.
func (u *SelfUpdater) Run(ctx context.Context, running string, desired func() string, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	var lastErr string
	for {
		if v := desired(); v != "" && v != running {
			if _, err := u.Apply(ctx, v); err != nil && !errors.Is(err, context.Canceled) && err.Error() != lastErr {
				lastErr = err.Error()
				u.logger().Error("runner update failed", "desired", v, "err", err)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
