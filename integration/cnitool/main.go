// cnitool: a CNI client on libcni (containernetworking/cni, Debian's
// golang-github-appc-cni-dev), used by integration/tests/e2e_ipv6.rs to drive the rendered
// conflist as container runtimes do (the upstream cnitool binary is not packaged). Same command
// line and environment as the CNI project's cnitool:
//
//	cnitool add|check|del <network name> <netns path>
//
// NETCONFPATH (conflist directory), CNI_PATH (plugin directories), CNI_IFNAME (default eth0),
// CNI_ARGS (k=v;k=v), CAP_ARGS (JSON capability arguments), plus CNI_CONTAINERID (default
// derived from the netns path, as cnitool does) and CNI_CACHE_DIR (libcni's result cache,
// default /var/lib/cni). ADD prints the result libcni caches; errors go to stderr, exit 1.
package main

import (
	"context"
	"crypto/sha512"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/containernetworking/cni/libcni"
)

func fail(format string, a ...interface{}) {
	fmt.Fprintf(os.Stderr, "cnitool: "+format+"\n", a...)
	os.Exit(1)
}

func main() {
	if len(os.Args) != 4 {
		fail("usage: cnitool add|check|del <net> <netns>")
	}
	action, name, netns := os.Args[1], os.Args[2], os.Args[3]
	confDir := os.Getenv("NETCONFPATH")
	if confDir == "" {
		confDir = "/etc/cni/net.d"
	}
	list, err := libcni.LoadConfList(confDir, name)
	if err != nil {
		fail("load %s from %s: %v", name, confDir, err)
	}
	var capArgs map[string]interface{}
	if s := os.Getenv("CAP_ARGS"); s != "" {
		if err := json.Unmarshal([]byte(s), &capArgs); err != nil {
			fail("CAP_ARGS: %v", err)
		}
	}
	var cniArgs [][2]string
	for _, kv := range strings.Split(os.Getenv("CNI_ARGS"), ";") {
		if kv == "" {
			continue
		}
		parts := strings.SplitN(kv, "=", 2)
		if len(parts) != 2 {
			fail("CNI_ARGS: %q is not k=v", kv)
		}
		cniArgs = append(cniArgs, [2]string{parts[0], parts[1]})
	}
	ifName := os.Getenv("CNI_IFNAME")
	if ifName == "" {
		ifName = "eth0"
	}
	containerID := os.Getenv("CNI_CONTAINERID")
	if containerID == "" {
		containerID = fmt.Sprintf("cnitool-%x", sha512.Sum512([]byte(netns)))[:20]
	}
	netns, _ = filepath.Abs(netns)
	rt := &libcni.RuntimeConf{
		ContainerID:    containerID,
		NetNS:          netns,
		IfName:         ifName,
		Args:           cniArgs,
		CapabilityArgs: capArgs,
		CacheDir:       os.Getenv("CNI_CACHE_DIR"),
	}
	cni := libcni.NewCNIConfig(filepath.SplitList(os.Getenv("CNI_PATH")), nil)
	ctx := context.Background()
	switch action {
	case "add":
		result, err := cni.AddNetworkList(ctx, list, rt)
		if err != nil {
			fail("add: %v", err)
		}
		if err := result.Print(); err != nil {
			fail("print: %v", err)
		}
	case "check":
		if err := cni.CheckNetworkList(ctx, list, rt); err != nil {
			fail("check: %v", err)
		}
	case "del":
		if err := cni.DelNetworkList(ctx, list, rt); err != nil {
			fail("del: %v", err)
		}
	default:
		fail("unknown action %q", action)
	}
}
