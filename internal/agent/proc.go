package agent

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

const defaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// startError is a failure to start a command, with the exit code a shell would report.
type startError struct {
	code int32 // 127 not found, 126 not executable
	msg  string
	// permanent: trying again cannot help (the main command is not restarted).
	permanent bool
}

func (e *startError) Error() string { return e.msg }

// procSpec describes a child to start.
type procSpec struct {
	argv  []string
	env   []string
	dir   string
	cred  *syscall.Credential
	files [3]*os.File // child's stdin, stdout, stderr
	tty   bool        // files are a pty slave: new session with it as controlling tty
}

// proc is a started child, leader of its own process group.
type proc struct {
	pid  int
	done <-chan syscall.WaitStatus

	mu       sync.Mutex
	exited   bool
	exitedCh chan struct{} // closed by wait once the child has been reaped
}

// kill signals the child's process group unless the child has been reaped (its pid, and
// so the group id, may be reused afterwards).
func (p *proc) kill(sig syscall.Signal) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.exited {
		_ = syscall.Kill(-p.pid, sig)
	}
}

// wait blocks until the child has been reaped and returns its shell-style exit code.
func (p *proc) wait() int32 {
	ws := <-p.done
	p.mu.Lock()
	p.exited = true
	p.mu.Unlock()
	close(p.exitedCh)
	return exitCode(ws)
}

func exitCode(ws syscall.WaitStatus) int32 {
	switch {
	case ws.Exited():
		return int32(ws.ExitStatus())
	case ws.Signaled():
		return 128 + int32(ws.Signal())
	}
	return 255
}

func describeExit(code int32) string {
	if code > 128 && code < 128+65 {
		sig := syscall.Signal(code - 128)
		return fmt.Sprintf("killed by signal %d (%v)", int(sig), sig)
	}
	return fmt.Sprintf("exited with code %d", code)
}

// startProc resolves the command against the child's PATH and starts it in a new process
// group (or a new session for a tty).
func startProc(s procSpec) (*proc, error) {
	if len(s.argv) == 0 || s.argv[0] == "" {
		return nil, &startError{code: 127, msg: "empty command", permanent: true}
	}
	fi, err := os.Stat(s.dir)
	if err != nil {
		return nil, &startError{code: 126, msg: fmt.Sprintf("working directory %q: %v", s.dir, unwrapPathErr(err)), permanent: true}
	}
	if !fi.IsDir() {
		return nil, &startError{code: 126, msg: fmt.Sprintf("working directory %q: not a directory", s.dir), permanent: true}
	}
	path, err := lookPath(s.argv[0], envValue(s.env, "PATH"), s.dir)
	if err != nil {
		return nil, err
	}
	attr := &syscall.ProcAttr{
		Dir:   s.dir,
		Env:   s.env,
		Files: []uintptr{s.files[0].Fd(), s.files[1].Fd(), s.files[2].Fd()},
		Sys:   &syscall.SysProcAttr{Credential: s.cred},
	}
	if s.tty {
		attr.Sys.Setsid = true
		attr.Sys.Setctty = true
		attr.Sys.Ctty = 0
	} else {
		attr.Sys.Setpgid = true
	}
	pid, done, err := getReaper().forkExec(path, s.argv, attr)
	if err != nil {
		return nil, forkError(s.argv[0], err)
	}
	return &proc{pid: pid, done: done, exitedCh: make(chan struct{})}, nil
}

func unwrapPathErr(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

func forkError(name string, err error) error {
	var errno syscall.Errno
	if errors.As(err, &errno) {
		switch errno {
		case syscall.ENOENT, syscall.ENOTDIR:
			return &startError{code: 127, msg: fmt.Sprintf("%s: %v", name, errno), permanent: true}
		case syscall.EACCES, syscall.EPERM, syscall.ENOEXEC, syscall.EISDIR, syscall.ELIBBAD, syscall.ETXTBSY:
			return &startError{code: 126, msg: fmt.Sprintf("%s: %v", name, errno), permanent: errno != syscall.ETXTBSY}
		}
	}
	return &startError{code: 126, msg: fmt.Sprintf("%s: %v", name, err)}
}

// lookPath finds file like a shell does, with the child's PATH (not the agent's).
func lookPath(file, pathEnv, dir string) (string, error) {
	if strings.Contains(file, "/") {
		return file, nil // ForkExec reports ENOENT/EACCES itself
	}
	if pathEnv == "" {
		pathEnv = defaultPath
	}
	for _, d := range filepath.SplitList(pathEnv) {
		if d == "" {
			d = "."
		}
		p := filepath.Join(d, file)
		if !filepath.IsAbs(p) {
			p = filepath.Join(dir, p)
		}
		fi, err := os.Stat(p)
		if err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", &startError{code: 127, msg: fmt.Sprintf("%s: command not found in PATH", file), permanent: true}
}

func envValue(env []string, key string) string {
	for i := len(env) - 1; i >= 0; i-- {
		if k, v, ok := strings.Cut(env[i], "="); ok && k == key {
			return v
		}
	}
	return ""
}

func hasEnv(env []string, key string) bool {
	for _, kv := range env {
		if k, _, _ := strings.Cut(kv, "="); k == key {
			return true
		}
	}
	return false
}

// userInfo is a resolved Config.User.
type userInfo struct {
	cred *syscall.Credential // nil: run as the agent's own user
	home string
}

// resolveUser resolves "", "name", "uid", "uid:gid", "name:group" against root's
// /etc/passwd and /etc/group, as container runtimes do: a numeric uid need not exist
// (gid 0 then), a name must.
func resolveUser(spec, root string) (userInfo, error) {
	if spec == "" {
		return userInfo{}, nil
	}
	userPart, groupPart, hasGroup := strings.Cut(spec, ":")
	passwd, _ := readColonFile(filepath.Join(root, "etc/passwd"))
	groups, _ := readColonFile(filepath.Join(root, "etc/group"))
	var (
		uid, gid uint64
		name     string
		home     = "/"
		found    bool
	)
	if n, err := strconv.ParseUint(userPart, 10, 32); err == nil {
		uid = n
		for _, f := range passwd {
			if len(f) >= 6 && f[2] == userPart {
				name, found = f[0], true
				gid, _ = strconv.ParseUint(f[3], 10, 32)
				home = f[5]
				break
			}
		}
	} else {
		for _, f := range passwd {
			if len(f) >= 6 && f[0] == userPart {
				var err1, err2 error
				uid, err1 = strconv.ParseUint(f[2], 10, 32)
				gid, err2 = strconv.ParseUint(f[3], 10, 32)
				if err1 != nil || err2 != nil {
					return userInfo{}, fmt.Errorf("user %q: bad /etc/passwd entry", userPart)
				}
				name, found, home = f[0], true, f[5]
				break
			}
		}
		if !found {
			return userInfo{}, fmt.Errorf("user %q: no matching entry in /etc/passwd", userPart)
		}
	}
	if hasGroup {
		if n, err := strconv.ParseUint(groupPart, 10, 32); err == nil {
			gid = n
		} else {
			ok := false
			for _, f := range groups {
				if len(f) >= 3 && f[0] == groupPart {
					gid, err = strconv.ParseUint(f[2], 10, 32)
					ok = err == nil
					break
				}
			}
			if !ok {
				return userInfo{}, fmt.Errorf("group %q: no matching entry in /etc/group", groupPart)
			}
		}
	}
	var supp []uint32
	if found && !hasGroup {
		for _, f := range groups {
			if len(f) < 4 {
				continue
			}
			for _, m := range strings.Split(f[3], ",") {
				if m == name {
					if g, err := strconv.ParseUint(f[2], 10, 32); err == nil && g != gid {
						supp = append(supp, uint32(g))
					}
				}
			}
		}
	}
	info := userInfo{home: home}
	if os.Getuid() == 0 || uint64(os.Getuid()) != uid || uint64(os.Getgid()) != gid {
		info.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), Groups: supp}
		if os.Getuid() != 0 {
			info.cred.NoSetGroups = true
		}
	}
	return info, nil
}

func readColonFile(path string) ([][]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out [][]string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		out = append(out, strings.Split(line, ":"))
	}
	return out, sc.Err()
}

// drain reads r into fn until EOF. After exited is closed it keeps reading only while
// data is immediately available (plus grace), so a background grandchild holding the
// pipe open cannot block the caller forever.
func drain(r *os.File, exited <-chan struct{}, grace time.Duration, fn func([]byte)) {
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		select {
		case <-exited:
			_ = r.SetReadDeadline(time.Now().Add(grace))
		case <-stop:
		}
	}()
	buf := make([]byte, 32<<10)
	for {
		n, err := r.Read(buf)
		if n > 0 {
			fn(buf[:n])
		}
		if err != nil {
			return // EOF, the grace deadline, or EIO from a pty whose slave side closed
		}
	}
}
