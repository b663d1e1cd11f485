// Package buildfake is an in-process sandboxd.build.v1.BuildService for the tests of
// its clients (the Go SDK, sbx): it records what they send and plays a scripted log per
// build, answering as the gateway is to (organization-less: every build is visible).
// Test-only (internal/archtest keeps servers from reaching it). Switch the client tests
// to gatewaytest once the gateway serves builds.
package buildfake

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	buildv1 "github.com/sandboxd/sandboxd/gen/sandboxd/build/v1"
	"github.com/sandboxd/sandboxd/gen/sandboxd/build/v1/buildv1connect"
	"github.com/sandboxd/sandboxd/internal/apierr"
)

// Server is the fake; its zero value is ready. Set the exported script fields before a
// StartBuild; read the recorded ones under no lock only once the calls returned.
type Server struct {
	buildv1connect.UnimplementedBuildServiceHandler

	// Log is the log every started build plays: events without seq (numbered from 1
	// at start), a Build event's build gets the build's ID and target. A build whose
	// log ends with a Build event of an ended state is that build at once; else it stays
	// RUNNING until CancelBuild (its followed log stays open).
	Log []*buildv1.BuildLogEvent
	// PageSize is ListBuilds' default page size (0: 50).
	PageSize int
	// FailNext is returned by the next call (and cleared).
	FailNext error
	// BreakAfter, when > 0, makes the next log stream fail UNAVAILABLE after sending
	// that many events (once; then cleared).
	BreakAfter int
	// Following, when set, gets the build ID each time a followed log stream has sent
	// what there is and waits for more (sends that would block are dropped).
	Following chan string

	mu      sync.Mutex
	builds  []*buildv1.Build // oldest first
	logs    map[string][]*buildv1.BuildLogEvent
	changed chan struct{} // closed and replaced on every change

	Starts   []*buildv1.StartBuildRequest
	Cancels  []string
	LogReqs  []*buildv1.StreamBuildLogsRequest
	ListReqs []*buildv1.ListBuildsRequest
}

// Step, Line and Final make log events.
func Step(n int32, instruction string, cached bool) *buildv1.BuildLogEvent {
	return &buildv1.BuildLogEvent{Event: &buildv1.BuildLogEvent_Step{Step: &buildv1.BuildStep{Number: n, Instruction: instruction, Cached: cached}}}
}

// Line is an output line of step.
func Line(step int32, stream buildv1.LogLine_Stream, text string) *buildv1.BuildLogEvent {
	return &buildv1.BuildLogEvent{Event: &buildv1.BuildLogEvent_Line{Line: &buildv1.LogLine{Stream: stream, Step: step, Text: text}}}
}

// Final is a state change to b (its ID and target are filled in).
func Final(b *buildv1.Build) *buildv1.BuildLogEvent {
	return &buildv1.BuildLogEvent{Event: &buildv1.BuildLogEvent_Build{Build: b}}
}

// NotFound is the gateway's answer for a missing build (apierr's, as the gateway makes
// it).
func NotFound(id string) error {
	return apierr.Newf(apierr.BuildNotFound, "build %q not found", id)
}

func ended(s buildv1.BuildState) bool {
	return s == buildv1.BuildState_BUILD_STATE_SUCCEEDED || s == buildv1.BuildState_BUILD_STATE_FAILED || s == buildv1.BuildState_BUILD_STATE_CANCELLED
}

// changedLocked wakes the followers.
func (s *Server) changedLocked() {
	if s.changed != nil {
		close(s.changed)
	}
	s.changed = make(chan struct{})
}

func (s *Server) fail() error {
	err := s.FailNext
	s.FailNext = nil
	return err
}

func (s *Server) find(id string) (int, error) {
	for i, b := range s.builds {
		if b.GetBuildId() == id {
			return i, nil
		}
	}
	return -1, NotFound(id)
}

// Add stores b as it is (for list and get tests) with log events.
func (s *Server) Add(b *buildv1.Build, log ...*buildv1.BuildLogEvent) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.logs == nil {
		s.logs = map[string][]*buildv1.BuildLogEvent{}
	}
	s.builds = append(s.builds, b)
	for i, e := range log {
		e.Seq = int64(i + 1)
	}
	s.logs[b.GetBuildId()] = log
	s.changedLocked()
}

// Build returns the build id as it is now (nil if none).
func (s *Server) Build(id string) *buildv1.Build {
	s.mu.Lock()
	defer s.mu.Unlock()
	i, err := s.find(id)
	if err != nil {
		return nil
	}
	return proto.Clone(s.builds[i]).(*buildv1.Build)
}

func (s *Server) StartBuild(_ context.Context, req *connect.Request[buildv1.StartBuildRequest]) (*connect.Response[buildv1.StartBuildResponse], error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.Starts = append(s.Starts, req.Msg)
	if err := s.fail(); err != nil {
		return nil, err
	}
	if s.logs == nil {
		s.logs = map[string][]*buildv1.BuildLogEvent{}
	}
	for _, b := range s.builds {
		if id := req.Msg.GetRequestId(); id != "" && b.GetBuildId() == "build-"+id {
			return connect.NewResponse(&buildv1.StartBuildResponse{Build: b}), nil
		}
	}
	b := &buildv1.Build{
		BuildId: "build-" + strconv.Itoa(len(s.builds)+1), State: buildv1.BuildState_BUILD_STATE_QUEUED,
		Dockerfile: req.Msg.GetDockerfile(), BuilderSize: req.Msg.GetBuilderSize(), CreateTime: timestamppb.Now(),
	}
	if id := req.Msg.GetRequestId(); id != "" {
		b.BuildId = "build-" + id
	}
	switch t := req.Msg.GetTarget().(type) {
	case *buildv1.StartBuildRequest_Template:
		b.Target = &buildv1.Build_Template{Template: t.Template}
	case *buildv1.StartBuildRequest_Repository:
		b.Target = &buildv1.Build_Repository{Repository: t.Repository}
	}
	queued := proto.Clone(b).(*buildv1.Build)
	var log []*buildv1.BuildLogEvent
	cur := b
	for i, e := range s.Log {
		e = proto.Clone(e).(*buildv1.BuildLogEvent)
		e.Seq, e.Time = int64(i+1), timestamppb.Now()
		if fb := e.GetBuild(); fb != nil {
			fb.BuildId, fb.CreateTime = b.GetBuildId(), b.GetCreateTime()
			switch t := b.GetTarget().(type) {
			case *buildv1.Build_Template:
				fb.Target = &buildv1.Build_Template{Template: t.Template}
			case *buildv1.Build_Repository:
				fb.Target = &buildv1.Build_Repository{Repository: t.Repository}
			}
			cur = fb
		}
		log = append(log, e)
	}
	if !ended(cur.GetState()) {
		cur = proto.Clone(b).(*buildv1.Build)
		cur.State = buildv1.BuildState_BUILD_STATE_RUNNING
	}
	s.builds = append(s.builds, cur)
	s.logs[b.GetBuildId()] = log
	s.changedLocked()
	return connect.NewResponse(&buildv1.StartBuildResponse{Build: queued}), nil
}

func (s *Server) GetBuild(_ context.Context, req *connect.Request[buildv1.GetBuildRequest]) (*connect.Response[buildv1.GetBuildResponse], error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.fail(); err != nil {
		return nil, err
	}
	i, err := s.find(req.Msg.GetBuildId())
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&buildv1.GetBuildResponse{Build: s.builds[i]}), nil
}

// ListBuilds pages newest first; the page token is the index to start at.
func (s *Server) ListBuilds(_ context.Context, req *connect.Request[buildv1.ListBuildsRequest]) (*connect.Response[buildv1.ListBuildsResponse], error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ListReqs = append(s.ListReqs, req.Msg)
	if err := s.fail(); err != nil {
		return nil, err
	}
	var all []*buildv1.Build
	for _, b := range slices.Backward(s.builds) {
		if t := req.Msg.GetTemplate(); t == "" || b.GetTemplate() == t {
			all = append(all, b)
		}
	}
	size := int(req.Msg.GetPageSize())
	if size <= 0 {
		size = s.PageSize
	}
	if size <= 0 {
		size = 50
	}
	start := 0
	if tok := req.Msg.GetPageToken(); tok != "" {
		n, err := strconv.Atoi(tok)
		if err != nil || n < 0 || n > len(all) {
			return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("bad page token %q", tok))
		}
		start = n
	}
	end := min(start+size, len(all))
	res := &buildv1.ListBuildsResponse{Builds: all[start:end]}
	if end < len(all) {
		res.NextPageToken = strconv.Itoa(end)
	}
	return connect.NewResponse(res), nil
}

func (s *Server) CancelBuild(_ context.Context, req *connect.Request[buildv1.CancelBuildRequest]) (*connect.Response[buildv1.CancelBuildResponse], error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	id := req.Msg.GetBuildId()
	s.Cancels = append(s.Cancels, id)
	if err := s.fail(); err != nil {
		return nil, err
	}
	i, err := s.find(id)
	if err != nil {
		return nil, err
	}
	if b := s.builds[i]; !ended(b.GetState()) {
		b = proto.Clone(b).(*buildv1.Build)
		b.State, b.EndTime = buildv1.BuildState_BUILD_STATE_CANCELLED, timestamppb.Now()
		s.builds[i] = b
		log := s.logs[id]
		s.logs[id] = append(log, &buildv1.BuildLogEvent{Seq: int64(len(log) + 1), Time: timestamppb.Now(),
			Event: &buildv1.BuildLogEvent_Build{Build: b}})
		s.changedLocked()
	}
	return connect.NewResponse(&buildv1.CancelBuildResponse{Build: s.builds[i]}), nil
}

// StreamBuildLogs sends the events after after_seq and, with follow, waits for more
// until the build ended and its last event was sent.
func (s *Server) StreamBuildLogs(ctx context.Context, req *connect.Request[buildv1.StreamBuildLogsRequest], st *connect.ServerStream[buildv1.StreamBuildLogsResponse]) error {
	s.mu.Lock()
	s.LogReqs = append(s.LogReqs, req.Msg)
	if err := s.fail(); err != nil {
		s.mu.Unlock()
		return err
	}
	id := req.Msg.GetBuildId()
	if _, err := s.find(id); err != nil {
		s.mu.Unlock()
		return err
	}
	breakAfter := s.BreakAfter
	s.BreakAfter = 0
	s.mu.Unlock()
	after := req.Msg.GetAfterSeq()
	sent := 0
	for {
		s.mu.Lock()
		i, _ := s.find(id)
		done := ended(s.builds[i].GetState())
		var batch []*buildv1.BuildLogEvent
		for _, e := range s.logs[id] {
			if e.GetSeq() > after {
				batch = append(batch, e)
			}
		}
		if s.changed == nil {
			s.changed = make(chan struct{})
		}
		wake := s.changed
		s.mu.Unlock()
		for _, e := range batch {
			if breakAfter > 0 && sent == breakAfter {
				return connect.NewError(connect.CodeUnavailable, fmt.Errorf("log stream of %s broke", id))
			}
			if err := st.Send(&buildv1.StreamBuildLogsResponse{Event: e}); err != nil {
				return err
			}
			sent++
			after = e.GetSeq()
		}
		if !req.Msg.GetFollow() || (done && len(batch) == 0) {
			return nil
		}
		if done {
			continue // send what came with the end, then stop
		}
		if s.Following != nil {
			select {
			case s.Following <- id:
			default:
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-wake:
		}
	}
}
