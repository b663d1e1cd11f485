package sbxcli

import (
	"fmt"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/timestamppb"

	auditv1 "github.com/sandboxd/sandboxd/gen/sandboxd/audit/v1"
	"github.com/sandboxd/sandboxd/internal/textclip"
)

// auditPage is how many events one call asks for.
const auditPage = 500

// auditCommand is `sbx admin audit`: the audit log (docs/audit.md), newest first, as a
// table or JSON lines (export).
func (a *app) auditCommand() *cobra.Command {
	var (
		since, until, method, key, result, org string
		limit                                  int
		jsonLines                              bool
	)
	cmd := &cobra.Command{
		Use:   "audit",
		Short: "Show the audit log: admin writes and sandbox lifecycle calls, newest first (needs a SANDBOX_ADMIN key)",
		Long: `Show the audit log: who (API key, organization, address) did what (method, target) with
which result, newest first. --since and --until take an RFC 3339 time or a duration before
now (24h, 7d). --json prints one JSON object per line (an export: --limit 0 prints every
event the filters select).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			now := time.Now()
			req := &auditv1.ListAuditEventsRequest{OrgId: org, KeyId: key, Method: method, Result: strings.ToUpper(result)}
			for _, t := range []struct {
				flag, v string
				dst     **timestamppb.Timestamp
			}{{"--since", since, &req.StartTime}, {"--until", until, &req.EndTime}} {
				if t.v == "" {
					continue
				}
				at, err := parseWhen(t.v, now)
				if err != nil {
					return fmt.Errorf("%s: %w", t.flag, err)
				}
				*t.dst = timestamppb.New(at)
			}
			if limit < 0 {
				return fmt.Errorf("--limit %d: 0 (every event) or more", limit)
			}
			adm, err := a.admin()
			if err != nil {
				return err
			}
			jl := jsonLines || a.json()
			var tw *tabwriter.Writer
			if !jl {
				tw = tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
				_, _ = fmt.Fprintln(tw, "TIME\tORG\tKEY\tSOURCE\tMETHOD\tTARGET\tRESULT\tREASON\tREQUEST")
			}
			n := 0
			for {
				req.PageSize = auditPage
				if limit > 0 {
					req.PageSize = int32(min(auditPage, limit-n))
				}
				out, err := adm.Audit.ListAuditEvents(cmd.Context(), connect.NewRequest(req))
				if err != nil {
					return err
				}
				for _, e := range out.Msg.GetEvents() {
					n++
					if jl {
						b, err := protojson.MarshalOptions{UseProtoNames: true}.Marshal(e)
						if err != nil {
							return err
						}
						if _, err := fmt.Fprintf(a.stdout, "%s\n", b); err != nil {
							return err
						}
						continue
					}
					m := e.GetMethod()
					if i := strings.LastIndexByte(m, '/'); i >= 0 {
						m = m[i+1:]
					}
					target := e.GetTargetType()
					if e.GetTargetId() != "" {
						target += "/" + e.GetTargetId()
					}
					// A platform admin's call on this organization's objects: its key and
					// organization (KEY@ACTOR_ORG).
					key := cell(e.GetKeyId())
					if e.GetActorOrgId() != "" {
						key += "@" + cell(e.GetActorOrgId())
					}
					_, _ = fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", e.GetTime().AsTime().Local().Format(time.RFC3339), cell(e.GetOrgId()), key,
						cell(e.GetSourceAddress()), cell(m), cell(target), cell(e.GetResult()), cell(e.GetReason()), cell(e.GetRequestId()))
				}
				req.PageToken = out.Msg.GetNextPageToken()
				if req.PageToken == "" || (limit > 0 && n >= limit) {
					break
				}
			}
			if tw != nil {
				return tw.Flush()
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&since, "since", "", "only events at or after this time (RFC 3339, or a duration before now: 24h, 7d)")
	f.StringVar(&until, "until", "", "only events before this time (RFC 3339, or a duration before now)")
	f.StringVar(&method, "method", "", "only calls of this method (CreateSandbox, or /package.Service/Method)")
	f.StringVar(&key, "key", "", "only calls of this API key ID")
	f.StringVar(&result, "result", "", "only calls with this result (OK, PERMISSION_DENIED, ...)")
	f.StringVar(&org, "org", "", `another organization, or "*" for every one (an admin key of the platform organization only)`)
	f.IntVar(&limit, "limit", 100, "at most this many events (0: every one)")
	f.BoolVar(&jsonLines, "json", false, "print JSON lines (one event per line)")
	return cmd
}

// parseWhen reads an RFC 3339 time or a duration before now (with a d suffix for days).
func parseWhen(v string, now time.Time) (time.Time, error) {
	if t, err := time.Parse(time.RFC3339, v); err == nil {
		return t, nil
	}
	d := v
	mult := time.Duration(1)
	if days, ok := strings.CutSuffix(v, "d"); ok {
		d, mult = days+"h", 24
	}
	dur, err := time.ParseDuration(d)
	if err != nil || dur < 0 {
		return time.Time{}, fmt.Errorf("%q is neither an RFC 3339 time nor a duration (24h, 7d)", v)
	}
	return now.Add(-dur * mult), nil
}

// cell is s for a table cell: a value holding a non-printable rune (a control
// sequence, a tab or newline that would forge cells or rows) is shown quoted and escaped.
func cell(s string) string {
	if textclip.AllPrintable(s) {
		return s
	}
	return strconv.QuoteToGraphic(s)
}
