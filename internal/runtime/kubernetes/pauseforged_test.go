package kubernetes

import (
	"errors"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/sandboxd/sandboxd/internal/runtime"
)

// victimCkpt is a well-formed checkpoint ID of another sandbox's, on the same node.
const victimCkpt = "c-victim-1"

// forgePaused rewrites paused sandbox id's Secret on cs: its checkpoint is cid, and
// tamper (when set) changes its annotations further.
func forgePaused(t *testing.T, cs *fake.Clientset, id, cid string, tamper func(map[string]string)) {
	t.Helper()
	sec, err := cs.CoreV1().Secrets("sbx").Get(t.Context(), secretName(id), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	sec.Annotations[annotationPausedCkpt] = cid
	if tamper != nil {
		tamper(sec.Annotations)
	}
	if _, err := cs.CoreV1().Secrets("sbx").Update(t.Context(), sec, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// TestSecurityRecoverForeignCheckpoint: a paused sandbox's Secret made to name another
// sandbox's checkpoint (well-formed, on the same node, listed by the node agent: of
// another sandbox, of the same sandbox ID in another namespace, a fork's image) is not
// taken over with it: the sandbox ends with Reason CheckpointLost naming why, and that
// checkpoint is not deleted — nor when the rest of the record is broken too.
func TestSecurityRecoverForeignCheckpoint(t *testing.T) {
	for _, tc := range []struct {
		name, want string
		entry      NodeCheckpointEntry
		tamper     func(map[string]string)
	}{
		{"other sandbox", "another sandbox", NodeCheckpointEntry{ID: victimCkpt, SandboxID: "p-b", Namespace: "sbx", Name: podName("p-b"), UID: "uid-b"}, nil},
		{"other namespace", "another namespace", NodeCheckpointEntry{ID: victimCkpt, SandboxID: "p-a", Namespace: "other", Name: podName("p-a"), UID: "uid-o"}, nil},
		{"fork image", "fork", NodeCheckpointEntry{ID: victimCkpt, SandboxID: "p-a", Namespace: "sbx", Name: podName("p-a"), UID: "uid-p-a", LeaveRunning: true}, nil},
		{"not listed", "no such complete image", NodeCheckpointEntry{ID: "c-else", SandboxID: "p-a", Namespace: "sbx"}, nil},
		{"broken record too", "version 9", NodeCheckpointEntry{ID: victimCkpt, SandboxID: "p-b", Namespace: "sbx", Name: podName("p-b"), UID: "uid-b"},
			func(a map[string]string) {
				a[annotationPausedPod] = strings.Replace(a[annotationPausedPod], `"v":1`, `"v":9`, 1)
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			agent := &fakeNodeAgent{}
			cs, _ := pausedBeforeRestart(t, recoverSpec("p-a"), agent)
			agent.others = []NodeCheckpointEntry{tc.entry}
			forgePaused(t, cs, "p-a", victimCkpt, tc.tamper)
			b2 := backendOn(t, recoverCfg(agent), cs)
			recs, err := b2.Recover(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			r := recovered(recs, "p-a")
			if r == nil || r.Paused || r.Exit == nil || r.Exit.Reason != "CheckpointLost" || !strings.Contains(r.Exit.Message, tc.want) {
				t.Fatalf("recovered %+v, want ended with Reason CheckpointLost naming %q", r, tc.want)
			}
			if got := agent.deletedIDs(); slices.Contains(got, victimCkpt) {
				t.Errorf("checkpoints deleted %v: the other sandbox's %s among them", got, victimCkpt)
			}
		})
	}
}

// TestSecurityResumeForeignCheckpointAgentAway: the node agent not reached at Recover,
// a forged paused sandbox is kept paused, and its Resume checks the checkpoint before it
// makes a Pod: it fails with ErrCheckpointLost, making no Pod; its Destroy does not
// delete the other sandbox's checkpoint.
func TestSecurityResumeForeignCheckpointAgentAway(t *testing.T) {
	agent := &fakeNodeAgent{}
	cs, _ := pausedBeforeRestart(t, recoverSpec("p-a"), agent)
	agent.others = []NodeCheckpointEntry{{ID: victimCkpt, SandboxID: "p-b", Namespace: "sbx", Name: podName("p-b"), UID: "uid-b"}}
	forgePaused(t, cs, "p-a", victimCkpt, nil)
	agent.listErr = errors.New("agent away")
	b2 := backendOn(t, recoverCfg(agent), cs)
	recs, err := b2.Recover(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if r := recovered(recs, "p-a"); r == nil || !r.Paused || r.Exit != nil {
		t.Fatalf("recovered %+v, want kept paused (the agent away)", r)
	}
	agent.mu.Lock()
	agent.listErr = nil
	agent.mu.Unlock()
	if _, err := b2.Resume(t.Context(), "p-a"); !errors.Is(err, runtime.ErrCheckpointLost) || !strings.Contains(err.Error(), "another sandbox") {
		t.Fatalf("Resume: %v, want ErrCheckpointLost naming another sandbox", err)
	}
	if _, err := cs.CoreV1().Pods("sbx").Get(t.Context(), podName("p-a"), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("a Pod after the refused Resume: %v, want none", err)
	}
	if err := b2.Destroy(t.Context(), "p-a"); err != nil {
		t.Fatal(err)
	}
	if got := agent.deletedIDs(); slices.Contains(got, victimCkpt) {
		t.Errorf("checkpoints deleted %v: the other sandbox's %s among them", got, victimCkpt)
	}
}

// TestSecurityInterruptedPauseOtherPod: a running sandbox's Secret marked paused (its
// own checkpoint, its node) whose checkpoint the agent took of another Pod is no pause
// cut short: its running Pod is not deleted.
func TestSecurityInterruptedPauseOtherPod(t *testing.T) {
	agent := &fakeNodeAgent{}
	cs, _ := pausedBeforeRestart(t, recoverSpec("p-a"), agent)
	sandboxPodOn(t, cs, "p-a", "uid-running", corev1.PodRunning)
	b2 := backendOn(t, recoverCfg(agent), cs)
	if _, err := b2.Recover(t.Context()); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().Pods("sbx").Get(t.Context(), podName("p-a"), metav1.GetOptions{}); err != nil {
		t.Errorf("the running Pod after Recover: %v, want kept", err)
	}
}

// TestRecoverPausedConfigChanged: a runner restarted with another image pull policy
// (or a record whose security context or pull policy is not this runner's) takes the
// paused sandbox over paused, resumes it with this runner's, and deletes no checkpoint.
func TestRecoverPausedConfigChanged(t *testing.T) {
	for _, tc := range []struct {
		name   string
		cfg    func(*Config)
		tamper func(map[string]string)
	}{
		{"pull policy flag", func(c *Config) { c.ImagePullPolicy = corev1.PullAlways }, nil},
		{"privileged record", nil, func(a map[string]string) {
			a[annotationPausedPod] = strings.Replace(a[annotationPausedPod], `"security_context":{`, `"security_context":{"privileged":true,`, 1)
		}},
		{"pull policy never", nil, func(a map[string]string) {
			a[annotationPausedPod] = strings.Replace(a[annotationPausedPod], `"IfNotPresent"`, `"Never"`, 1)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			agent := &fakeNodeAgent{}
			cs, _ := pausedBeforeRestart(t, recoverSpec("p-c"), agent)
			if tc.tamper != nil {
				forgePaused(t, cs, "p-c", "c-test-1", tc.tamper)
			}
			cfg := recoverCfg(agent)
			if tc.cfg != nil {
				tc.cfg(&cfg)
			}
			b2 := backendOn(t, cfg, cs)
			recs, err := b2.Recover(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			if r := recovered(recs, "p-c"); r == nil || !r.Paused || r.Exit != nil {
				t.Fatalf("recovered %+v, want paused", r)
			}
			if got := agent.deletedIDs(); len(got) != 0 {
				t.Errorf("checkpoints deleted %v, want none", got)
			}
			made := madeOnResume(t, b2, cs, "p-c")
			for _, c := range made.Spec.Containers {
				if sc := c.SecurityContext; sc != nil && sc.Privileged != nil && *sc.Privileged {
					t.Errorf("container %s resumed privileged", c.Name)
				}
				if c.ImagePullPolicy == corev1.PullNever {
					t.Errorf("container %s resumed with pull policy Never", c.Name)
				}
			}
		})
	}
}

// TestRecoverInterruptedPauseDeleteFails: a pause cut short whose checkpointed Pod
// cannot be deleted is not finished (a resume would meet the Pod): the sandbox is not
// taken over paused, and its Pod is recovered as it is.
func TestRecoverInterruptedPauseDeleteFails(t *testing.T) {
	agent := &fakeNodeAgent{}
	cs, _ := pausedBeforeRestart(t, recoverSpec("p-d"), agent)
	sandboxPodOn(t, cs, "p-d", "uid-p-d", corev1.PodFailed)
	cs.PrependReactor("delete", "pods", func(k8stesting.Action) (bool, k8sruntime.Object, error) {
		return true, nil, apierrors.NewInternalError(errors.New("etcd away"))
	})
	b2 := backendOn(t, recoverCfg(agent), cs)
	recs, err := b2.Recover(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if r := recovered(recs, "p-d"); r == nil || r.Paused {
		t.Fatalf("recovered %+v, want recovered, not paused (its Pod still there)", r)
	}
}
