package selfupdate

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/sandboxd/sandboxd/internal/release"
)

// Offer is what the control plane asks for in a heartbeat reply: a version and the
// SHA-256 of its binaries for this runner's architecture (from the release record).
type Offer struct {
	Version        string
	SandboxdSHA256 string
	// AgentSHA256 is "" when the release has no sandbox-agent for the architecture: the
	// runner keeps its agent.
	AgentSHA256 string
}

// FetchFunc writes one binary of a release (name "sandboxd" or "sandbox-agent") to w,
// failing past max bytes (the control plane's RunnerReleaseService.DownloadArtifact).
type FetchFunc func(ctx context.Context, version, arch, name string, w io.Writer, max int64) error

// ManifestFunc returns a version's signed release manifest and its signature as the
// control plane relays them (RunnerRegistrationService.GetRelease).
type ManifestFunc func(ctx context.Context, version string) (manifest, signature []byte, err error)

// Config configures an Updater.
type Config struct {
	// DataDir holds the state file.
	DataDir string
	Bins    Binaries
	// Running is this process's version; Arch its GOARCH.
	Running, Arch string
	Fetch         FetchFunc
	// Keys, when set, are the trusted release-signing keys (--release-keys): an update
	// is then installed only if Manifest returns a manifest one of them signed, for the
	// offered version, listing the downloaded binaries' checksums.
	Keys     []ed25519.PublicKey
	Manifest ManifestFunc
	// MaxBytes bounds one downloaded binary (default 512 MiB); DownloadTimeout one
	// download (default 5 min); ProbeTimeout the new sandboxd's `version` (default 15 s).
	MaxBytes        int64
	DownloadTimeout time.Duration
	ProbeTimeout    time.Duration
	// RunnerArgs, when not nil, are the running runner's flags (os.Args after "runner"):
	// before the swap the new sandboxd must accept them (`sandboxd CheckFlagsCommand
	// ARGS…` parses and validates them and exits, starting nothing), since it will be
	// re-executed with them.
	RunnerArgs []string
	// Restart stops the runner (sandboxes keep running) and re-executes the binary in
	// place; it is called once the new binaries are in place.
	Restart func(reason string)
	Logger  *slog.Logger
	// Now is the clock (tests); default time.Now.
	Now func() time.Time
}

// Updater installs the versions the control plane offers.
type Updater struct {
	cfg Config

	mu        sync.Mutex
	failed    string    // version not to try again while offered
	retryAt   time.Time // after a download error: not before
	backoff   time.Duration
	lastLog   string // the last failure logged, so a failure is logged once
	restarted bool
}

// New returns an Updater; the failed version recorded in the state file is remembered.
func New(cfg Config) (*Updater, error) {
	if cfg.Fetch == nil || cfg.Restart == nil || cfg.Bins.Sandboxd == "" || cfg.Running == "" || cfg.Arch == "" {
		return nil, errors.New("selfupdate: Fetch, Restart, Bins.Sandboxd, Running and Arch are required")
	}
	if cfg.MaxBytes <= 0 {
		cfg.MaxBytes = 512 << 20
	}
	if cfg.DownloadTimeout <= 0 {
		cfg.DownloadTimeout = 5 * time.Minute
	}
	if cfg.ProbeTimeout <= 0 {
		cfg.ProbeTimeout = 15 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	st, err := LoadState(cfg.DataDir)
	if err != nil {
		return nil, err
	}
	return &Updater{cfg: cfg, failed: st.Failed}, nil
}

// ErrVerify marks a failure of the downloaded binaries themselves (checksum, signature,
// the new sandboxd does not run): the version is not tried again while offered.
var ErrVerify = errors.New("release binaries refused")

// Apply installs offer when it names another version than the running one, one not
// failed before, and (after a download error) once its backoff is over. It reports
// whether it swapped the binaries (and called Restart).
func (u *Updater) Apply(ctx context.Context, offer Offer) (bool, error) {
	log := u.cfg.Logger
	u.mu.Lock()
	if u.restarted {
		u.mu.Unlock()
		return false, nil
	}
	if offer.Version != u.failed && u.failed != "" {
		// The control plane asks for something else now: the failure is forgotten.
		log.Info("runner update: the failed version is no longer asked for", "failed", u.failed, "desired", offer.Version)
		u.failed = ""
		u.forgetFailed()
	}
	skip := offer.Version == "" || offer.Version == u.cfg.Running || offer.Version == u.failed || u.cfg.Now().Before(u.retryAt)
	u.mu.Unlock()
	if skip {
		return false, nil
	}
	err := u.install(ctx, offer)
	if err == nil {
		return true, nil
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	if errors.Is(err, ErrVerify) {
		u.failed = offer.Version
		u.recordFailed(offer.Version, err.Error())
		log.Error("runner update refused; the runner stays on its version and will not try this one again until another is asked for",
			"running", u.cfg.Running, "desired", offer.Version, "err", err)
		return false, err
	}
	u.backoff = min(max(2*u.backoff, 10*time.Second), 10*time.Minute)
	u.retryAt = u.cfg.Now().Add(u.backoff)
	if msg := offer.Version + err.Error(); msg != u.lastLog {
		u.lastLog = msg
		log.Warn("runner update failed; retrying later", "running", u.cfg.Running, "desired", offer.Version, "retry_in", u.backoff, "err", err)
	}
	return false, err
}

// Run applies offer() every interval until ctx ends or the runner restarts. offer
// reports ok=false while it knows nothing yet (no heartbeat went through since the
// start): an empty desired version then is no news, and must not make the updater
// forget the version that failed.
func (u *Updater) Run(ctx context.Context, offer func() (Offer, bool), interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		if o, ok := offer(); ok {
			if swapped, _ := u.Apply(ctx, o); swapped {
				return
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (u *Updater) install(ctx context.Context, offer Offer) error {
	cfg, log := u.cfg, u.cfg.Logger
	if _, err := release.ParseVersion(offer.Version); err != nil {
		return fmt.Errorf("%w: version %q: %w", ErrVerify, offer.Version, err)
	}
	if release.CheckChecksum(offer.SandboxdSHA256) != nil {
		return fmt.Errorf("%w: the release record of %s has no valid sandboxd checksum for %s (got %q)", ErrVerify, offer.Version, cfg.Arch, offer.SandboxdSHA256)
	}
	if offer.AgentSHA256 != "" && release.CheckChecksum(offer.AgentSHA256) != nil {
		return fmt.Errorf("%w: the release record of %s has an invalid sandbox-agent checksum for %s (got %q)", ErrVerify, offer.Version, cfg.Arch, offer.AgentSHA256)
	}
	log.Info("runner update: downloading", "from", cfg.Running, "to", offer.Version, "arch", cfg.Arch)
	var staged []string
	defer func() {
		for _, p := range staged {
			_ = os.Remove(p)
		}
	}()
	sd, err := u.stage(ctx, offer.Version, "sandboxd", cfg.Bins.Sandboxd, offer.SandboxdSHA256)
	if sd != "" {
		staged = append(staged, sd)
	}
	if err != nil {
		return err
	}
	agent := ""
	if offer.AgentSHA256 != "" && cfg.Bins.Agent != "" {
		if agent, err = u.stage(ctx, offer.Version, "sandbox-agent", cfg.Bins.Agent, offer.AgentSHA256); agent != "" {
			staged = append(staged, agent)
		}
		if err != nil {
			return err
		}
	}
	if err := u.checkSignature(ctx, offer); err != nil {
		return err
	}
	if err := u.probe(ctx, sd, offer.Version); err != nil {
		return err
	}
	if err := u.checkFlags(ctx, sd, offer.Version); err != nil {
		return err
	}
	log.Info("runner update: binaries verified; swapping them in", "to", offer.Version, "sandboxd", cfg.Bins.Sandboxd, "agent_replaced", agent != "", "signature_checked", len(cfg.Keys) > 0)
	if err := Swap(cfg.DataDir, cfg.Bins, sd, agent, Trial{From: cfg.Running, To: offer.Version, Since: cfg.Now().UTC()}); err != nil {
		return err
	}
	staged = nil
	u.mu.Lock()
	u.restarted = true
	u.mu.Unlock()
	log.Info("runner update: binaries in place (previous ones kept as *.prev); re-executing", "from", cfg.Running, "to", offer.Version)
	cfg.Restart("update to " + offer.Version)
	return nil
}

// stage downloads name to a temporary file beside target and checks its SHA-256.
func (u *Updater) stage(ctx context.Context, version, name, target, want string) (string, error) {
	cfg := u.cfg
	f, err := os.CreateTemp(filepath.Dir(target), "."+filepath.Base(target)+"-"+version+"-*")
	if err != nil {
		return "", fmt.Errorf("stage %s: %w", name, err)
	}
	path := f.Name()
	dctx, cancel := context.WithTimeout(ctx, cfg.DownloadTimeout)
	defer cancel()
	h := sha256.New()
	lw := &limitWriter{w: io.MultiWriter(f, h), n: cfg.MaxBytes}
	err = cfg.Fetch(dctx, version, cfg.Arch, name, lw, cfg.MaxBytes)
	if lw.over {
		err = fmt.Errorf("%w: %s of %s is larger than %d bytes", ErrVerify, name, version, cfg.MaxBytes)
	}
	if err == nil {
		err = f.Chmod(0o755)
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		if errors.Is(err, ErrVerify) {
			return path, err
		}
		return path, fmt.Errorf("download %s of %s: %w", name, version, err)
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != want {
		return path, fmt.Errorf("%w: %s of %s has SHA-256 %s, the release says %s", ErrVerify, name, version, got, want)
	}
	u.cfg.Logger.Info("runner update: downloaded and checksum verified", "name", name, "version", version, "bytes", lw.written, "sha256", want)
	return path, nil
}

// checkSignature verifies the signed manifest of offer's version when keys are
// configured: signed by a trusted key, for that version, listing the checksums that the
// downloads were checked against.
func (u *Updater) checkSignature(ctx context.Context, offer Offer) error {
	cfg := u.cfg
	if len(cfg.Keys) == 0 {
		return nil
	}
	if cfg.Manifest == nil {
		return fmt.Errorf("%w: --release-keys is set but this runner cannot fetch signed manifests from the control plane", ErrVerify)
	}
	raw, sig, err := cfg.Manifest(ctx, offer.Version)
	if err != nil {
		return fmt.Errorf("signed manifest of %s: %w", offer.Version, err)
	}
	if len(raw) == 0 {
		return fmt.Errorf("%w: release %s has no signed manifest, and --release-keys requires one", ErrVerify, offer.Version)
	}
	m, err := release.Verify(cfg.Keys, raw, sig)
	if err != nil {
		return fmt.Errorf("%w: manifest of %s: %w", ErrVerify, offer.Version, err)
	}
	b := m.Binaries[cfg.Arch]
	switch {
	case m.Version != offer.Version:
		return fmt.Errorf("%w: the signed manifest is for %s, not %s", ErrVerify, m.Version, offer.Version)
	case b.Sandboxd != offer.SandboxdSHA256:
		return fmt.Errorf("%w: the signed manifest's sandboxd checksum for %s is %q, the release record's %q", ErrVerify, cfg.Arch, b.Sandboxd, offer.SandboxdSHA256)
	case offer.AgentSHA256 != "" && b.Agent != offer.AgentSHA256:
		return fmt.Errorf("%w: the signed manifest's sandbox-agent checksum for %s is %q, the release record's %q", ErrVerify, cfg.Arch, b.Agent, offer.AgentSHA256)
	}
	u.cfg.Logger.Info("runner update: release manifest signature verified", "version", offer.Version)
	return nil
}

// probe runs the staged sandboxd's `version`: it must run here and say it is version.
// A binary that does not even start is refused before anything is replaced.
func (u *Updater) probe(ctx context.Context, path, version string) error {
	pctx, cancel := context.WithTimeout(ctx, u.cfg.ProbeTimeout)
	defer cancel()
	var out bytes.Buffer
	cmd := exec.CommandContext(pctx, path, "version")
	cmd.Stdout, cmd.Stderr = &limitWriter{w: &out, n: 4 << 10}, &limitWriter{w: &out, n: 4 << 10}
	cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%w: the new sandboxd does not run (`%s version`: %w: %q)", ErrVerify, filepath.Base(path), err, strings.TrimSpace(out.String()))
	}
	if got := strings.TrimSpace(out.String()); got != "sandboxd "+version {
		return fmt.Errorf("%w: the new sandboxd says %q, not \"sandboxd %s\"", ErrVerify, got, version)
	}
	return nil
}

// CheckFlagsCommand is the (unlisted) sandboxd subcommand that parses and validates a
// runner's flags and exits: 0 when `sandboxd runner` would accept them.
const CheckFlagsCommand = "runner-check-flags"

// checkFlags runs the staged sandboxd's CheckFlagsCommand on the runner's flags. A
// sandboxd older than the command (it answers `unknown command`) cannot be asked: the
// check is skipped, and a version that then refuses the flags is rolled back on its
// first start instead.
func (u *Updater) checkFlags(ctx context.Context, path, version string) error {
	if u.cfg.RunnerArgs == nil {
		return nil
	}
	pctx, cancel := context.WithTimeout(ctx, u.cfg.ProbeTimeout)
	defer cancel()
	var out bytes.Buffer
	cmd := exec.CommandContext(pctx, path, append([]string{CheckFlagsCommand}, u.cfg.RunnerArgs...)...)
	cmd.Stdout, cmd.Stderr = &limitWriter{w: &out, n: 4 << 10}, &limitWriter{w: &out, n: 4 << 10}
	cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}
	err := cmd.Run()
	if err == nil {
		return nil
	}
	msg := strings.TrimSpace(out.String())
	if strings.Contains(msg, fmt.Sprintf("unknown command %q", CheckFlagsCommand)) {
		u.cfg.Logger.Warn("runner update: the new sandboxd cannot check the runner's flags (it predates the check); installing it unchecked", "version", version)
		return nil
	}
	return fmt.Errorf("%w: the new sandboxd refuses this runner's flags (`%s %s …`: %w: %q)", ErrVerify, filepath.Base(path), CheckFlagsCommand, err, msg)
}

// recordFailed and forgetFailed keep the failed version in the state file, so a restart
// does not retry it either. Called with u.mu held.
func (u *Updater) recordFailed(version, reason string) {
	st, err := LoadState(u.cfg.DataDir)
	if err == nil {
		st.Failed, st.FailedReason = version, reason
		err = SaveState(u.cfg.DataDir, st)
	}
	if err != nil {
		u.cfg.Logger.Warn("runner update: could not record the failed version", "version", version, "err", err)
	}
}

func (u *Updater) forgetFailed() {
	st, err := LoadState(u.cfg.DataDir)
	if err == nil && st.Failed != "" {
		st.Failed, st.FailedReason = "", ""
		err = SaveState(u.cfg.DataDir, st)
	}
	if err != nil {
		u.cfg.Logger.Warn("runner update: could not update the state file", "err", err)
	}
}

// limitWriter writes at most n bytes to w and notes whether more came.
type limitWriter struct {
	w       io.Writer
	n       int64
	written int64
	over    bool
}

func (l *limitWriter) Write(p []byte) (int, error) {
	if int64(len(p)) > l.n-l.written {
		l.over = true
		return 0, errors.New("size limit exceeded")
	}
	n, err := l.w.Write(p)
	l.written += int64(n)
	return n, err
}
