package imagebuild

import (
	"regexp"
	"strconv"
	"strings"
	"unicode/utf8"
)

// MaxLine is the longest log line kept (bytes); a longer line is cut at a rune boundary.
const MaxLine = 4 << 10

// MaxInstruction is the longest step instruction kept (bytes).
const MaxInstruction = 1 << 10

// Step is one build step as Buildah prints it: "STEP 3/8: RUN make".
type Step struct {
	Number      int    // 1-based, FROM included
	Total       int    // the steps of the build (of all stages, as Buildah counts)
	Instruction string // "RUN make", at most MaxInstruction bytes
	Cached      bool   // "--> Using cache …" followed it
}

var (
	stepLine = regexp.MustCompile(`^STEP ([0-9]{1,6})/([0-9]{1,6}): (.*)$`)
	// Buildah's last line when a step fails: Error: building at STEP "RUN …": exit status 7
	failLine = regexp.MustCompile(`^Error: building at STEP "(.*)": (.*)$`)
)

// Steps follows a build's output line by line (stdout and stderr, the build's sandbox
// wrote them: every line is untrusted and bounded here) and tracks the steps.
type Steps struct {
	steps      []Step
	failed     string // the failing step's instruction, from the Error line
	failReason string
}

// MaxSteps bounds what Steps keeps, whatever the output claims (so the steps of a build:
// a runner reporting more answered wrongly).
const MaxSteps = 1000

// Line takes one line of output (without its newline) and reports whether it began a
// step (then step is the new step).
func (s *Steps) Line(line string) (step Step, began bool) {
	line = strings.TrimRight(line, "\r")
	if m := stepLine.FindStringSubmatch(line); m != nil {
		n, _ := strconv.Atoi(m[1])
		total, _ := strconv.Atoi(m[2])
		if n < 1 || n > total || len(s.steps) >= MaxSteps {
			return Step{}, false
		}
		st := Step{Number: n, Total: total, Instruction: Clip(m[3], MaxInstruction)}
		s.steps = append(s.steps, st)
		return st, true
	}
	if strings.HasPrefix(line, "--> Using cache ") && len(s.steps) > 0 {
		s.steps[len(s.steps)-1].Cached = true
		return Step{}, false
	}
	if m := failLine.FindStringSubmatch(line); m != nil {
		s.failed, s.failReason = Clip(m[1], MaxInstruction), Clip(m[2], MaxLine)
	}
	return Step{}, false
}

// All returns the steps seen so far.
func (s *Steps) All() []Step { return append([]Step(nil), s.steps...) }

// Current returns the number of the step running now (0 before the first).
func (s *Steps) Current() int {
	if len(s.steps) == 0 {
		return 0
	}
	return s.steps[len(s.steps)-1].Number
}

// Failed returns the step Buildah named as failing ("Error: building at STEP …") and
// why ("exit status 7"); ok is false when no step was named. The step is the last one
// begun with that instruction (Buildah names the instruction, not its number).
func (s *Steps) Failed() (step Step, why string, ok bool) {
	if s.failed == "" {
		return Step{}, "", false
	}
	for i := len(s.steps) - 1; i >= 0; i-- {
		if s.steps[i].Instruction == s.failed {
			return s.steps[i], s.failReason, true
		}
	}
	return Step{Instruction: s.failed}, s.failReason, true
}

// Clip returns s as valid UTF-8 of at most n bytes (invalid bytes replaced, cut at a
// rune boundary).
func Clip(s string, n int) string {
	if !utf8.ValidString(s) {
		s = strings.ToValidUTF8(s, "\uFFFD")
	}
	if len(s) <= n {
		return s
	}
	i := n
	for i > 0 && !utf8.RuneStart(s[i]) {
		i--
	}
	return s[:i]
}
