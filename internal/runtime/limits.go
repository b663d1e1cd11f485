package runtime

import (
	"fmt"
	"maps"
	"path"
	"slices"
	"strings"

	"github.com/sandboxd/sandboxd/internal/agentconfig"
	"github.com/sandboxd/sandboxd/internal/textclip"
)

// Size limits of what a caller hands a sandbox's processes: the main command at create
// (command, args, environment, files) and every exec (argv, environment). The target
// system documents none of these, so they are ours, chosen so that whatever passes also
// fits what Linux's execve(2) takes: each string at most MAX_ARG_STRLEN (128 KiB with
// its terminating NUL) and argv plus envp together well under ARG_MAX (a quarter of the
// default 8 MiB stack: 2 MiB), leaving room for the image's own environment.
const (
	MaxArgs      = 4096        // entries of args (create) or command (exec), command included
	MaxArgBytes  = 128<<10 - 1 // one argument: MAX_ARG_STRLEN less its NUL
	MaxArgsBytes = 512 << 10   // all arguments together
	MaxEnvVars   = 1024        // environment variables
	MaxEnvKeyLen = 256         // bytes of one variable's name
	MaxEnvBytes  = 128<<10 - 2 // one variable: len(KEY)+len(VALUE), plus "=" and NUL, fits MAX_ARG_STRLEN
	MaxEnvsBytes = 512 << 10   // all variables together (names and values)
	// MaxSecretEnvVars bounds the secret environment variables of a sandbox, over all
	// its containers (Container.SecretEnv; the target's "≤ 50 secrets" per sandbox).
	MaxSecretEnvVars = 50
	MaxFiles         = 256      // file mounts of a container
	MaxFilePath      = 1024     // bytes of a file mount's path (PATH_MAX is 4096)
	MaxFileBytes     = 32 << 20 // content of one file mount (the unary file cap)
	MaxFilesBytes    = 64 << 20 // content of all file mounts together
)

// AgentDir is the directory the platform mounts for the sandbox's agent (its binary,
// configuration, socket and state; agentconfig.Dir). Nothing a caller sends may write
// there: not a file mount at create, not a WriteFile.
const AgentDir = agentconfig.Dir

// Reserved reports whether the absolute path p is the agent's directory or under it,
// however it is spelled ("//.sandboxd/", "/x/../.sandboxd").
func Reserved(p string) bool {
	c := path.Clean("/" + p)
	return c == AgentDir || strings.HasPrefix(c, AgentDir+"/")
}

// AddFunc records a violation of field.
type AddFunc func(field, format string, args ...any)

// CheckArgs checks an argument vector: at most MaxArgs entries (already counts entries
// before args, such as the command at create), each NUL-free and at most MaxArgBytes,
// at most MaxArgsBytes together (already counts bytes before, too). field is the list's
// field; an entry is field[i].
func CheckArgs(field string, args []string, already, alreadyBytes int, add AddFunc) {
	if n := already + len(args); n > MaxArgs {
		add(field, "has %d entries, at most %d allowed", n, MaxArgs)
		return
	}
	total := alreadyBytes
	for i, a := range args {
		f := fmt.Sprintf("%s[%d]", field, i)
		switch {
		case strings.IndexByte(a, 0) >= 0:
			add(f, "must not contain NUL bytes")
		case len(a) > MaxArgBytes:
			add(f, "is %d bytes, at most %d allowed", len(a), MaxArgBytes)
		}
		total += len(a)
	}
	if total > MaxArgsBytes {
		add(field, "is %d bytes in all, at most %d allowed", total, MaxArgsBytes)
	}
}

// CheckEnv checks environment variables: at most MaxEnvVars; names non-empty, at most
// MaxEnvKeyLen, without '=' or NUL; values NUL-free; each variable at most MaxEnvBytes
// and all at most MaxEnvsBytes. A bad name is a violation of field itself, a bad value
// of field[NAME]. Violations come in name order.
func CheckEnv(field string, env map[string]string, add AddFunc) {
	if len(env) > MaxEnvVars {
		add(field, "has %d variables, at most %d allowed", len(env), MaxEnvVars)
		return
	}
	total := 0
	for _, k := range slices.Sorted(maps.Keys(env)) {
		v := env[k]
		total += len(k) + len(v)
		switch {
		case k == "" || strings.ContainsAny(k, "=\x00"):
			add(field, "invalid name %q: must be non-empty without '=' or NUL", textclip.Clip(k, 64))
			continue
		case len(k) > MaxEnvKeyLen:
			add(field, "name %q is %d bytes, at most %d allowed", textclip.Clip(k, 64), len(k), MaxEnvKeyLen)
			continue
		}
		f := field + "[" + k + "]"
		switch {
		case strings.IndexByte(v, 0) >= 0:
			add(f, "must not contain NUL bytes")
		case len(k)+len(v) > MaxEnvBytes:
			add(f, "is %d bytes with its name, at most %d allowed", len(k)+len(v), MaxEnvBytes)
		}
	}
	if total > MaxEnvsBytes {
		add(field, "is %d bytes in all, at most %d allowed", total, MaxEnvsBytes)
	}
}

// CheckFilePath checks a file mount's path for what comes on top of its shape (absolute,
// clean, no '..', checked where files are taken): at most MaxFilePath bytes, elements at
// most 255 bytes (NAME_MAX), and not the agent's reserved directory.
func CheckFilePath(p string) error {
	if len(p) > MaxFilePath {
		return fmt.Errorf("is %d bytes, at most %d allowed", len(p), MaxFilePath)
	}
	for el := range strings.SplitSeq(p, "/") {
		if len(el) > 255 {
			return fmt.Errorf("has a %d-byte element, at most 255 allowed", len(el))
		}
	}
	if Reserved(p) {
		return fmt.Errorf("%q is under %s, which the platform reserves for the sandbox's agent", p, AgentDir)
	}
	return nil
}
