package span

import (
	"context"
	"regexp"
	"testing"
	"time"
)

func TestRecord(t *testing.T) {
	if From(context.Background()) != nil {
		t.Fatal("a context without a record has one")
	}
	start := time.Now()
	Mark(context.Background(), "nothing", &start) // no record: no panic, *t moves on
	ctx, r := New(context.Background())
	r.Add("a step", 2*time.Millisecond)
	r.Add("b", time.Millisecond)
	r.Add("a step", 3*time.Millisecond)
	inner, r2 := New(ctx)
	r2.Add("inner", time.Millisecond)
	if From(inner) != r2 || From(ctx) != r {
		t.Fatal("New does not carry its own record")
	}
	got := r.String()
	if !regexp.MustCompile(`^a_step=5\.00ms/2 b=1\.00ms total=[0-9.]+ms$`).MatchString(got) {
		t.Fatalf("String() = %q", got)
	}
	for range maxSteps + 10 {
		r.Add("x", 1)
	}
	if len(r.steps) != maxSteps {
		t.Fatalf("%d steps kept, want at most %d", len(r.steps), maxSteps)
	}
	var nilRec *Record
	nilRec.Add("x", 1)
	if nilRec.String() != "" {
		t.Fatal("a nil record prints")
	}
}
