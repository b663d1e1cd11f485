// Command standin-agent is a minimal stand-in for sandbox-agent, used by the local
// backend's tests only while cmd/sandbox-agent does not build: it serves Exec and Status
// on the inherited fd 3, runs the main command (restarting a non-zero exit up to the
// limit), forwards SIGTERM, writes status.json and exits when the main command ends.
package main

import (
	"bytes"
	"context"
	"errors"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	agentv1 "github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1"
	"github.com/sandboxd/sandboxd/gen/sandboxd/agent/v1/agentv1connect"
	"github.com/sandboxd/sandboxd/internal/agentconfig"
)

type service struct {
	agentv1connect.UnimplementedAgentServiceHandler
	cfg *agentconfig.Config
	mu  sync.Mutex
	st  *agentv1.StatusResponse
}

func (s *service) Exec(ctx context.Context, req *connect.Request[agentv1.ExecRequest]) (*connect.Response[agentv1.ExecResponse], error) {
	if len(req.Msg.Command) == 0 {
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("empty command"))
	}
	cmd := exec.CommandContext(ctx, req.Msg.Command[0], req.Msg.Command[1:]...)
	cmd.Env = s.cfg.Env
	cmd.Dir = s.cfg.WorkingDir
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	cmd.Stdin = bytes.NewReader(req.Msg.Stdin)
	err := cmd.Run()
	code := int32(0)
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		ws := ee.Sys().(syscall.WaitStatus)
		code = int32(ws.ExitStatus())
		if ws.Signaled() {
			code = 128 + int32(ws.Signal())
		}
	case err != nil:
		return nil, connect.NewError(connect.CodeFailedPrecondition, err)
	}
	return connect.NewResponse(&agentv1.ExecResponse{Stdout: out.Bytes(), Stderr: errb.Bytes(), ExitCode: code}), nil
}

func (s *service) Status(context.Context, *connect.Request[agentv1.StatusRequest]) (*connect.Response[agentv1.StatusResponse], error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return connect.NewResponse(proto.Clone(s.st).(*agentv1.StatusResponse)), nil
}

func (s *service) update(f func(*agentv1.StatusResponse)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f(s.st)
	b, _ := protojson.Marshal(s.st)
	p := filepath.Join(agentconfig.StateDir, agentconfig.StatusFile)
	_ = os.WriteFile(p+".tmp", b, 0o644)
	_ = os.Rename(p+".tmp", p)
}

func main() {
	cfg, err := agentconfig.Load(agentconfig.ConfigPath)
	if err != nil {
		os.Stderr.WriteString(err.Error() + "\n")
		os.Exit(2)
	}
	s := &service{cfg: cfg, st: &agentv1.StatusResponse{State: agentv1.MainState_MAIN_STATE_STARTING}}
	ln, err := net.FileListener(os.NewFile(agentconfig.ListenFD, "listen"))
	if err != nil {
		os.Stderr.WriteString(err.Error() + "\n")
		os.Exit(2)
	}
	mux := http.NewServeMux()
	mux.Handle(agentv1connect.NewAgentServiceHandler(s))
	var protos http.Protocols
	protos.SetUnencryptedHTTP2(true)
	go (&http.Server{Handler: mux, Protocols: &protos}).Serve(ln)

	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM)
	stopped := false
	for restarts := 0; ; restarts++ {
		cmd := exec.Command(cfg.Argv[0], cfg.Argv[1:]...)
		cmd.Env, cmd.Dir = cfg.Env, cfg.WorkingDir
		cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
		if err := cmd.Start(); err != nil {
			s.update(func(st *agentv1.StatusResponse) {
				st.State, st.Reason, st.Message = agentv1.MainState_MAIN_STATE_FAILED, "StartError", err.Error()
			})
			os.Exit(1)
		}
		s.update(func(st *agentv1.StatusResponse) {
			st.State, st.Pid, st.RestartCount, st.StartedAt = agentv1.MainState_MAIN_STATE_RUNNING, int32(cmd.Process.Pid), int32(restarts), timestamppb.Now()
		})
		done := make(chan struct{})
		go func() {
			for {
				select {
				case <-sigs:
					stopped = true
					cmd.Process.Signal(syscall.SIGTERM)
				case <-done:
					return
				}
			}
		}()
		_ = cmd.Wait()
		close(done)
		ws := cmd.ProcessState.Sys().(syscall.WaitStatus)
		code := int32(ws.ExitStatus())
		if ws.Signaled() {
			code = 128 + int32(ws.Signal())
		}
		final, state, reason := true, agentv1.MainState_MAIN_STATE_COMPLETED, "Completed"
		switch {
		case stopped:
			state, reason = agentv1.MainState_MAIN_STATE_STOPPED, "Stopped"
		case code == 0:
		case restarts < cfg.RestartLimit:
			final, state, reason = false, agentv1.MainState_MAIN_STATE_RESTARTING, "Error"
		case cfg.RestartLimit > 0:
			state, reason = agentv1.MainState_MAIN_STATE_FAILED, "RestartLimit"
		default:
			state, reason = agentv1.MainState_MAIN_STATE_FAILED, "Error"
		}
		s.update(func(st *agentv1.StatusResponse) {
			st.State, st.ExitCode, st.Reason, st.FinishedAt = state, &code, reason, timestamppb.Now()
		})
		if final {
			time.Sleep(10 * time.Millisecond) // let in-flight responses go out
			os.Exit(0)
		}
	}
}
