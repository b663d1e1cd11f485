package imagebuild

import (
	"strings"
	"testing"
	"unicode/utf8"
)

// buildahOutput is Buildah 1.28's output (stdout and stderr interleaved) for a build
// whose fourth step fails after two cached steps, as TestBuildInGVisor sees it.
const buildahOutput = `STEP 1/4: FROM localhost/sandboxd/busybox:latest
STEP 2/4: RUN echo fine
--> Using cache 3c4f0e5a1b2c
--> 3c4f0e5a1b2c
STEP 3/4: ENV A=b
--> Using cache 9d8e7f6a5b4c
--> 9d8e7f6a5b4c
STEP 4/4: RUN echo about to fail && exit 7
about to fail
error building at STEP "RUN echo about to fail && exit 7": error while running runtime: exit status 7
Error: building at STEP "RUN echo about to fail && exit 7": while running runtime: exit status 7`

func TestSteps(t *testing.T) {
	var s Steps
	var began []int
	for _, l := range strings.Split(buildahOutput, "\n") {
		if st, ok := s.Line(l); ok {
			began = append(began, st.Number)
			if st.Total != 4 {
				t.Errorf("step %d: total %d, want 4", st.Number, st.Total)
			}
		}
	}
	if len(began) != 4 || began[0] != 1 || began[3] != 4 {
		t.Fatalf("steps begun: %v, want 1..4", began)
	}
	all := s.All()
	if all[0].Cached || !all[1].Cached || !all[2].Cached || all[3].Cached {
		t.Errorf("cached: %+v, want steps 2 and 3 only", all)
	}
	if all[3].Instruction != "RUN echo about to fail && exit 7" {
		t.Errorf("step 4: %q", all[3].Instruction)
	}
	if s.Current() != 4 {
		t.Errorf("current %d, want 4", s.Current())
	}
	st, why, ok := s.Failed()
	if !ok || st.Number != 4 || st.Instruction != "RUN echo about to fail && exit 7" || why != "while running runtime: exit status 7" {
		t.Errorf("failed: %+v %q %v, want step 4 and its exit status", st, why, ok)
	}
}

func TestStepsNoFailure(t *testing.T) {
	var s Steps
	for _, l := range []string{"STEP 1/2: FROM x", "STEP 2/2: COPY . .", "COMMIT localhost/built:1", "--> 1234"} {
		s.Line(l)
	}
	if _, _, ok := s.Failed(); ok {
		t.Error("a build without an Error line reports a failed step")
	}
	if s.Current() != 2 || s.All()[1].Cached {
		t.Errorf("steps %+v", s.All())
	}
}

// Lines a sandbox may print to look like steps: a step beyond its total, number 0,
// huge numbers, a cache line before any step, and an instruction far over the bound.
func TestStepsHostile(t *testing.T) {
	var s Steps
	for _, l := range []string{"STEP 5/4: RUN x", "STEP 0/4: RUN x", "STEP 1234567/9999999: RUN x", "--> Using cache abc"} {
		if _, ok := s.Line(l); ok {
			t.Errorf("%q began a step", l)
		}
	}
	st, ok := s.Line("STEP 1/1: RUN " + strings.Repeat("é", MaxInstruction))
	if !ok || len(st.Instruction) > MaxInstruction || !utf8.ValidString(st.Instruction) {
		t.Errorf("long instruction: %d bytes, valid %v", len(st.Instruction), utf8.ValidString(st.Instruction))
	}
	for i := 0; i < MaxSteps+10; i++ {
		s.Line("STEP 1/1: RUN x")
	}
	if n := len(s.All()); n != MaxSteps {
		t.Errorf("kept %d steps, want at most %d", n, MaxSteps)
	}
}

func TestClip(t *testing.T) {
	for _, c := range []struct {
		in   string
		n    int
		want string
	}{
		{"abc", 5, "abc"}, {"abcdef", 3, "abc"}, {"aé", 2, "a"}, {"a\xffb", 10, "a\uFFFDb"}, {"", 0, ""},
	} {
		if got := Clip(c.in, c.n); got != c.want {
			t.Errorf("Clip(%q, %d) = %q, want %q", c.in, c.n, got, c.want)
		}
	}
}

func FuzzSteps(f *testing.F) {
	for _, l := range strings.Split(buildahOutput, "\n") {
		f.Add(l)
	}
	f.Add("STEP 1/1: \xff\xfe")
	f.Fuzz(func(t *testing.T, line string) {
		var s Steps
		s.Line("STEP 1/3: FROM x")
		st, began := s.Line(line)
		if began && (st.Number < 1 || st.Number > st.Total || len(st.Instruction) > MaxInstruction || !utf8.ValidString(st.Instruction)) {
			t.Fatalf("%q began %+v", line, st)
		}
		if f, why, ok := s.Failed(); ok && (len(f.Instruction) > MaxInstruction || len(why) > MaxLine || !utf8.ValidString(why)) {
			t.Fatalf("%q failed %+v %q", line, f, why)
		}
	})
}
