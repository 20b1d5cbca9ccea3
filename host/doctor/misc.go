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

// checkAPISocket checks the directory of the API's unix socket: present,
// a directory, writable by this user, not writable by everyone (anyone
// could replace the socket and receive the engine's calls).
func checkAPISocket(_ context.Context, e *env) Result {
	listen := e.st.API.Listen
	path, ok := socketPath(listen)
	if !ok {
		if listen == "" {
			return passf("the API is disabled ($.api.listen is empty); no socket")
		}
		return passf("the API listens on TCP %s; no socket to check", listen).with(map[string]any{"listen": listen})
	}
	dir := filepath.Dir(path)
	detail := map[string]any{"socket": path, "dir": dir}
	fi, err := e.sys.Stat(dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return failf("the socket directory %s does not exist: create it for the serve user (install -d -m 0750 -o USER %s)", dir, dir).with(detail)
	case err != nil:
		return failf("the socket directory %s cannot be read: %v", dir, err).with(detail)
	case !fi.IsDir():
		return failf("%s, the directory of socket %s, is not a directory: fix $.api.listen", dir, path).with(detail)
	}
	mode := fi.Mode()
	detail["mode"] = fmt.Sprintf("%#o", mode.Perm()|mode&fs.ModeSticky)
	if err := e.sys.Access(dir, AccessWrite); err != nil {
		return failf("serve cannot create its socket in %s (%v): run serve as the directory's owner or chown it", dir, err).with(detail)
	}
	if mode.Perm()&0o002 != 0 {
		if mode&fs.ModeSticky != 0 {
			return warnf("the socket directory %s is world-writable (sticky): another user can take the socket name before serve starts; use a directory of the serve user (install -d -m 0750 %s/kvtier)", dir, dir).with(detail)
		}
		return failf("the socket directory %s is world-writable: anyone can replace the socket and receive the engine's calls; chmod o-w %s, or use a directory of the serve user", dir, dir).with(detail)
	}
	return passf("the socket directory %s exists, is writable by this user and not by everyone", dir).with(detail)
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
