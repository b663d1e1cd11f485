package k8s

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sandboxd/sandboxd/internal/runtime"
	"github.com/sandboxd/sandboxd/internal/runtime/kubernetes"
)

// TestKubernetesSecretsOutOfFiles: a KUBERNETES store's secrets reach the command's
// environment (single and multi-container sandboxes, every container that names the
// store, an init container too) while no file sandboxd writes holds the value: the agent
// config in the Pod's run emptyDir names the variable only (the agent takes the value from
// its own environment), and the Pod spec holds references.
func TestKubernetesSecretsOutOfFiles(t *testing.T) {
	newBackend, client, ns := groupBackend(t)
	b := newBackend()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	org := randomID("org-")
	name := randomID("sec-")
	const valA, valB = "value-a-5f0c1e", "value-b-9d2a7b"
	if _, err := client.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{kubernetes.LabelSecretStoreOrg: runtime.OrgHash(org), kubernetes.LabelSecretStore: "kube"}},
		Data:       map[string][]byte{"a": []byte(valA), "b": []byte(valB)},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.CoreV1().Secrets(ns).Delete(context.Background(), name, metav1.DeleteOptions{}) })
	ref := func(env, key string) []runtime.SecretRef {
		return []runtime.SecretRef{{EnvVar: env, Store: "kube", Secret: name, Key: key}}
	}
	// hide is a pattern matching v that the exec's own argv does not hold.
	hide := func(v string) string { return "'" + v[:len(v)-1] + "[" + v[len(v)-1:] + "]'" }
	// noValueInFiles: no file under the agent's dirs holds either value, and the
	// completed config names the variable.
	noValueInFiles := func(t *testing.T, id, container, env string) {
		t.Helper()
		out, code, err := groupExec(t, b, id, container, "sh", "-c", "find /.sandboxd -type f -exec grep -l -e "+hide(valA)+" -e "+hide(valB)+" {} + ; echo done")
		if err != nil || out != "done\n" {
			t.Errorf("%s: a file under /.sandboxd holds a secret value: %q (exit %d), %v", container, out, code, err)
		}
		cfg, _, err := groupExec(t, b, id, container, "cat", "/.sandboxd/run/agent-config.json")
		if err != nil || !strings.Contains(cfg, `"env_from_process":["`+env+`"]`) {
			t.Errorf("%s: agent config %q, %v; want it to name %s", container, cfg, err, env)
		}
	}

	t.Run("single", func(t *testing.T) {
		id := randomID("sf-")
		spec := &runtime.Spec{ID: id, Meta: map[string]string{runtime.MetaOrg: org},
			Container: runtime.Container{Image: busybox, Command: "sleep", Args: []string{"3600"}, SecretRefs: ref("TOKEN", "a")}}
		if _, err := b.Create(ctx, spec); err != nil {
			t.Fatal(err)
		}
		defer func() { _ = b.Destroy(context.Background(), id) }()
		// The main command's environment (its /proc) and an exec's both have it.
		if out, _, err := groupExec(t, b, id, "", "sh", "-c", "echo $TOKEN; tr '\\0' '\\n' < /proc/$(pidof sleep)/environ | grep ^TOKEN="); err != nil || out != valA+"\nTOKEN="+valA+"\n" {
			t.Errorf("TOKEN: %q, %v", out, err)
		}
		noValueInFiles(t, id, "", "TOKEN")
	})

	t.Run("multi", func(t *testing.T) {
		id := randomID("sfm-")
		spec := &runtime.Spec{ID: id, Meta: map[string]string{runtime.MetaOrg: org},
			Container: runtime.Container{Name: "app", Image: busybox, Command: "sh", Args: []string{"-c", "cat /shared/init > /tmp/init; exec sleep 3600"},
				SecretRefs: ref("TOKEN", "a"), VolumeMounts: []runtime.VolumeMount{{Volume: "shared", Path: "/shared"}}},
			Sidecars: []runtime.Container{
				{Name: "side", Image: busybox, Command: "sleep", Args: []string{"3600"}, SecretRefs: ref("OTHER", "b")},
				{Name: "plain", Image: busybox, Command: "sleep", Args: []string{"3600"}},
			},
			InitContainers: []runtime.Container{{Name: "setup", Image: busybox, Command: "sh", Args: []string{"-c", "echo \"$INIT\" | wc -c > /shared/init"},
				SecretRefs: ref("INIT", "b"), VolumeMounts: []runtime.VolumeMount{{Volume: "shared", Path: "/shared"}}}},
			Volumes: []runtime.Volume{{Name: "shared"}},
		}
		if _, err := b.Create(ctx, spec); err != nil {
			t.Fatal(err)
		}
		defer func() { _ = b.Destroy(context.Background(), id) }()
		for c, want := range map[string]string{"app": valA + "||", "side": "|" + valB + "|", "plain": "||"} {
			if out, _, err := groupExec(t, b, id, c, "sh", "-c", "echo \"$TOKEN|$OTHER|$INIT\""); err != nil || out != want+"\n" {
				t.Errorf("%s: %q, %v; want %s", c, out, err, want)
			}
		}
		// The init container saw its value (its length, with the newline).
		if out, _, err := groupExec(t, b, id, "app", "sh", "-c", "tr -d ' ' < /tmp/init"); err != nil || strings.TrimSpace(out) != "15" {
			t.Errorf("init container's INIT length: %q, %v", out, err)
		}
		noValueInFiles(t, id, "app", "TOKEN")
		noValueInFiles(t, id, "side", "OTHER")
		pod, err := client.CoreV1().Pods(ns).Get(ctx, "sbx-"+id, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, ct := range append(pod.Spec.InitContainers, pod.Spec.Containers...) {
			for _, e := range ct.Env {
				if strings.Contains(e.Value, "value-") {
					t.Errorf("the Pod spec holds a value: %s %+v", ct.Name, e)
				}
			}
		}
	})
}
