package kubernetes

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/sandboxd/sandboxd/internal/metrics/counters"
)

// apiserverEvents makes cs list events as the API server does and the fake does not:
// by field selector (the event fields the API server selects on), in key (name) order,
// Limit items a page with a Continue token. listed counts the items served; pageCap, when
// not zero, is how many a page holds whatever Limit says (a server that ignores it).
func apiserverEvents(cs *fake.Clientset, listed *atomic.Int64, pageCap int) {
	cs.PrependReactor("list", "events", func(a k8stesting.Action) (bool, k8sruntime.Object, error) {
		la := a.(k8stesting.ListActionImpl)
		obj, err := cs.Tracker().List(corev1.SchemeGroupVersion.WithResource("events"), corev1.SchemeGroupVersion.WithKind("Event"), la.GetNamespace())
		if err != nil {
			return true, nil, err
		}
		sel := la.GetListRestrictions().Fields
		var items []corev1.Event
		for _, ev := range obj.(*corev1.EventList).Items {
			f := fields.Set{"involvedObject.kind": ev.InvolvedObject.Kind, "involvedObject.name": ev.InvolvedObject.Name,
				"involvedObject.uid": string(ev.InvolvedObject.UID), "reason": ev.Reason}
			if sel == nil || sel.Matches(f) {
				items = append(items, ev)
			}
		}
		slices.SortFunc(items, func(x, y corev1.Event) int { return strings.Compare(x.Name, y.Name) })
		from, _ := strconv.Atoi(la.ListOptions.Continue)
		items = items[min(from, len(items)):]
		n := len(items)
		if l := int(la.ListOptions.Limit); l > 0 && l < n {
			n = l
		}
		if pageCap > 0 {
			n = min(pageCap, len(items))
		}
		out := &corev1.EventList{Items: items[:n]}
		if n < len(items) {
			out.Continue = strconv.Itoa(from + n)
		}
		listed.Add(int64(len(out.Items)))
		return true, out, nil
	})
}

// A Pod with many other events (a probe failing with ever other output) before its pull
// events: the pulls are still found (issue 24: one page of 256 of all of its events missed
// them).
func TestRecordPullsPastOtherEvents(t *testing.T) {
	b, cs := newFakeBackend(t, Config{})
	var listed atomic.Int64
	apiserverEvents(cs, &listed, 0)
	b.eventsWait = []time.Duration{0}
	t0 := time.Now().Truncate(time.Second)
	create := func(ev corev1.Event) {
		t.Helper()
		if _, err := cs.CoreV1().Events("sbx").Create(t.Context(), &ev, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 3 * maxPodEvents {
		ev := pulledEvent("sbx-s7", "u7", "spec.containers{sandbox}", fmt.Sprintf("Readiness probe failed: %d", i), t0)
		ev.Name, ev.Reason = fmt.Sprintf("sbx-s7.a%05d", i), "Unhealthy"
		create(ev)
	}
	pulled := pulledEvent("sbx-s7", "u7", "spec.containers{sandbox}", `Successfully pulled image "busybox" in 700ms (700ms including waiting)`, t0)
	pulled.Name = "sbx-s7.z1"
	create(pulled)
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "sbx-s7", Namespace: "sbx", UID: "u7"},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: containerGate}, {Name: containerMain}}}}
	before := counters.Values()
	b.recordPulls(context.Background(), pod, 1, nil, nil)
	if d := delta(before, `cwsandbox_image_pulls_total{cache="miss",result="ok"}`); d != 1 {
		t.Fatalf("pulls recorded: %v, want the one behind %d other events", d, 3*maxPodEvents)
	}
	if d := delta(before, `cwsandbox_image_pull_duration_seconds_sum{cache="miss",result="ok"}`); d < 0.699 || d > 0.701 {
		t.Errorf("pull duration sum grew by %v, want 0.7", d)
	}
}

// However many events of a wanted reason a Pod has, and whatever a server puts on a page,
// at most maxPodEventPages pages of maxPodEvents are read of each reason.
func TestPodEventsBounded(t *testing.T) {
	for _, pageCap := range []int{0, 10 * maxPodEvents} {
		t.Run(fmt.Sprintf("page %d", pageCap), func(t *testing.T) {
			b, cs := newFakeBackend(t, Config{})
			var listed atomic.Int64
			apiserverEvents(cs, &listed, pageCap)
			t0 := time.Now()
			for i := range 2 * maxPodEventPages * maxPodEvents {
				for _, reason := range []string{reasonPulled, reasonFailed} {
					ev := pulledEvent("sbx-s8", "u8", fmt.Sprintf("spec.containers{c%d}", i), `Container image "x" already present on machine`, t0)
					ev.Name, ev.Reason = fmt.Sprintf("sbx-s8.%s%05d", reason, i), reason
					if _, err := cs.CoreV1().Events("sbx").Create(t.Context(), &ev, metav1.CreateOptions{}); err != nil {
						t.Fatal(err)
					}
				}
			}
			pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "sbx-s8", Namespace: "sbx", UID: "u8"}}
			evs, err := b.podEvents(pod, []string{reasonPulled, reasonFailed})
			if err != nil {
				t.Fatal(err)
			}
			if want := 2 * maxPodEventPages * maxPodEvents; len(evs) != want {
				t.Fatalf("%d events kept, want %d", len(evs), want)
			}
			if pageCap == 0 && listed.Load() != int64(len(evs)) {
				t.Errorf("%d events listed, %d kept: pages beyond the bound read", listed.Load(), len(evs))
			}
		})
	}
}
