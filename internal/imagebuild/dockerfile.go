package imagebuild

import (
	"bytes"
	"errors"
	"fmt"
	"strings"

	"github.com/moby/buildkit/frontend/dockerfile/parser"
	"github.com/moby/buildkit/frontend/dockerfile/shell"
)

// Bounds of a Dockerfile the runner reads (the rest is Buildah's, inside the builder).
const (
	MaxDockerfileBytes = 1 << 20
	MaxBases           = 16
)

// Bases returns the images a Dockerfile builds from (its FROM lines and COPY --from
// images, not its own stages or scratch), in order of first use, as written after the
// meta ARGs (before the first FROM, overridden by buildArgs) are expanded. The runner
// pulls each (policy, the caller's credentials) and hands it in: the builder reaches no
// registry.
func Bases(dockerfile []byte, buildArgs map[string]string) ([]string, error) {
	if len(dockerfile) > MaxDockerfileBytes {
		return nil, fmt.Errorf("the Dockerfile has %d bytes, at most %d", len(dockerfile), MaxDockerfileBytes)
	}
	res, err := parser.Parse(bytes.NewReader(dockerfile))
	if err != nil {
		return nil, fmt.Errorf("the Dockerfile: %w", err)
	}
	lex := shell.NewLex(res.EscapeToken)
	meta := map[string]string{}
	var metaKeys []string
	env := func() shell.EnvGetter {
		kv := make([]string, 0, len(metaKeys))
		for _, k := range metaKeys {
			kv = append(kv, k+"="+meta[k])
		}
		return shell.EnvsFromSlice(kv)
	}
	stages := map[string]bool{}
	var bases []string
	seen := map[string]bool{}
	add := func(ref string, line int) error {
		if ref == "" || strings.EqualFold(ref, "scratch") || stages[strings.ToLower(ref)] || seen[ref] {
			return nil
		}
		if len(bases) == MaxBases {
			return fmt.Errorf("line %d: more than %d base images", line, MaxBases)
		}
		seen[ref] = true
		bases = append(bases, ref)
		return nil
	}
	inStage := false
	for _, n := range res.AST.Children {
		switch strings.ToLower(n.Value) {
		case "arg":
			if inStage {
				continue
			}
			for a := n.Next; a != nil; a = a.Next {
				k, v, hasDefault := strings.Cut(a.Value, "=")
				if bv, ok := buildArgs[k]; ok {
					v = bv
				} else if !hasDefault {
					v = ""
				}
				if _, ok := meta[k]; !ok {
					metaKeys = append(metaKeys, k)
				}
				meta[k] = v
			}
		case "from":
			inStage = true
			if n.Next == nil {
				return nil, fmt.Errorf("line %d: FROM without an image", n.StartLine)
			}
			ref, _, err := lex.ProcessWord(n.Next.Value, env())
			if err != nil {
				return nil, fmt.Errorf("line %d: FROM %s: %w", n.StartLine, n.Next.Value, err)
			}
			if err := add(ref, n.StartLine); err != nil {
				return nil, err
			}
			if as := n.Next.Next; as != nil && strings.EqualFold(as.Value, "as") && as.Next != nil {
				stages[strings.ToLower(as.Next.Value)] = true
			}
		case "copy", "add":
			for _, f := range n.Flags {
				from, ok := strings.CutPrefix(f, "--from=")
				if !ok || isNumber(from) {
					continue
				}
				if err := add(from, n.StartLine); err != nil {
					return nil, err
				}
			}
		}
	}
	if !inStage {
		return nil, errors.New("the Dockerfile has no FROM")
	}
	return bases, nil
}

func isNumber(s string) bool {
	if s == "" {
		return false
	}
	for _, r := range s {
		if r < '0' || r > '9' {
			return false
		}
	}
	return true
}
