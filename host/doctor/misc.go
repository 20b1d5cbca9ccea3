package doctor

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"strings"

	"github.com/kvtier/kvtier/host/config"
)

// checkAPISocket checks the unix socket kvtier serve will listen on
// (Options.Socket; without it, the socket of $.api.listen): whether the
// path is free, a stale file a dead serve left (serve removes it at start)
// or held by a live serve that answers (a second serve there refuses to
// start); and its directory: writable by this user (or absent, with an
// ancestor serve can create it in), not writable by everyone (anyone
// could replace the socket and receive the engine's calls).
func checkAPISocket(_ context.Context, e *env) Result {
	path, flag := e.opts.Socket, "--socket"
	if path == "" {
		listen := e.st.API.Listen
		var ok bool
		if path, ok = socketPath(listen); !ok {
			if listen == "" {
				return passf("the API is disabled ($.api.listen is empty); no socket")
			}
			return passf("the API listens on TCP %s; no socket to check", listen).with(map[string]any{"listen": listen})
		}
		flag = "$.api.listen"
	}
	dir := filepath.Dir(path)
	detail := map[string]any{"socket": path, "dir": dir}
	var state string
	fi, err := e.sys.Stat(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		state = fmt.Sprintf("the socket %s is free", path)
		detail["state"] = "free"
	case err != nil:
		// A missing or unreadable directory answers here too; the
		// directory checks below say which.
		state = fmt.Sprintf("the socket %s cannot be checked (%v)", path, err)
		detail["state"] = "unknown"
	case fi.Mode()&fs.ModeSocket == 0:
		detail["state"] = "not_socket"
		return failf("%s exists and is not a socket: serve refuses to start there; remove it or give serve another %s", path, flag).with(detail)
	default:
		d, ok := e.sys.(SocketDialer)
		if !ok {
			state = fmt.Sprintf("the socket file %s exists (whether a serve answers was not probed)", path)
			detail["state"] = "unknown"
			break
		}
		if err := d.DialUnix(path); err == nil {
			detail["state"] = "live"
			return warnf("a live serve answers on %s: another serve there refuses to start; stop that one or give the new one another %s", path, flag).with(detail)
		}
		state = fmt.Sprintf("%s is a stale socket file (no serve answers; serve removes it at start)", path)
		detail["state"] = "stale"
	}
	probe, missing, err := existingDir(e.sys, dir)
	switch {
	case err != nil:
		return failf("%s; its directory %s cannot be used: %v", state, dir, err).with(detail)
	case missing:
		if err := e.sys.Access(probe, AccessWrite); err != nil {
			return failf("%s; its directory %s does not exist and serve cannot create it in %s (%v): create it for the serve user (install -d -m 0700 -o USER %s)", state, dir, probe, err, dir).with(detail)
		}
		return passf("%s; its directory %s does not exist yet: serve creates it (mode 0700) in %s", state, dir, probe).with(detail)
	}
	fi, err = e.sys.Stat(dir)
	if err != nil {
		return failf("%s; its directory %s cannot be read: %v", state, dir, err).with(detail)
	}
	mode := fi.Mode()
	detail["mode"] = fmt.Sprintf("%#o", mode.Perm()|mode&fs.ModeSticky)
	if err := e.sys.Access(dir, AccessWrite); err != nil {
		return failf("%s; serve cannot create its socket in %s (%v): run serve as the directory's owner or chown it", state, dir, err).with(detail)
	}
	if mode.Perm()&0o002 != 0 {
		if mode&fs.ModeSticky != 0 {
			return warnf("%s; its directory %s is world-writable (sticky): another user can take the socket name before serve starts; use a directory of the serve user (install -d -m 0750 %s/kvtier)", state, dir, dir).with(detail)
		}
		return failf("%s; its directory %s is world-writable: anyone can replace the socket and receive the engine's calls; chmod o-w %s, or use a directory of the serve user", state, dir, dir).with(detail)
	}
	return passf("%s; its directory %s exists, is writable by this user and not by everyone", state, dir).with(detail)
}

// pluginRef is one plugin binary of the stack, with its YAML path.
type pluginRef struct {
	yamlPath string
	spec     *config.PluginSpec
}

func pluginRefs(st *config.Stack) []pluginRef {
	var out []pluginRef
	for i, t := range st.Tiers {
		if t.Plugin != nil {
			out = append(out, pluginRef{fmt.Sprintf("$.tiers[%d].plugin", i), t.Plugin})
		}
		if t.Index != nil && t.Index.Plugin != nil {
			out = append(out, pluginRef{fmt.Sprintf("$.tiers[%d].index.plugin", i), t.Index.Plugin})
		}
	}
	return out
}

// checkPluginPins checks each plugin binary: present, a regular file,
// executable by this user, SHA-256 as pinned.
func checkPluginPins(_ context.Context, e *env) Result {
	refs := pluginRefs(e.st)
	if len(refs) == 0 {
		return passf("the stack has no plugin tier or index")
	}
	parts := make([]Result, 0, len(refs))
	for _, r := range refs {
		p := r.spec.Path
		detail := map[string]any{"yaml_path": r.yamlPath, "path": p, "pinned": strings.ToLower(r.spec.SHA256)}
		fi, err := e.sys.Stat(p)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			parts = append(parts, failf("%s: %s does not exist (a relative path is taken from serve's working directory): build or install it (make plugins), or fix %s.path", r.yamlPath, p, r.yamlPath).with(detail))
			continue
		case err != nil:
			parts = append(parts, failf("%s: %s cannot be read: %v", r.yamlPath, p, err).with(detail))
			continue
		case !fi.Mode().IsRegular():
			parts = append(parts, failf("%s: %s is not a regular file (mode %s): point %s.path at the binary", r.yamlPath, p, fi.Mode(), r.yamlPath).with(detail))
			continue
		}
		if fi.Mode().Perm()&0o111 == 0 || e.sys.Access(p, AccessExec) != nil {
			parts = append(parts, failf("%s: %s is not executable by this user (mode %s): chmod +x %s", r.yamlPath, p, fi.Mode().Perm(), p).with(detail))
			continue
		}
		sum, err := e.sys.FileSHA256(p)
		if err != nil {
			parts = append(parts, failf("%s: cannot hash %s: %v", r.yamlPath, p, err).with(detail))
			continue
		}
		detail["sha256"] = sum
		if !strings.EqualFold(sum, r.spec.SHA256) {
			parts = append(parts, failf("%s: %s has SHA-256 %s, the config pins %s: serve will refuse it; reinstall the pinned build, or if you trust this one run `kvtier plugin sum %s` and paste its block at %s",
				r.yamlPath, p, sum, strings.ToLower(r.spec.SHA256), p, r.yamlPath).with(detail))
			continue
		}
		parts = append(parts, passf("%s: %s is executable and matches its pin", r.yamlPath, p).with(detail))
	}
	return merge("plugins", parts)
}
