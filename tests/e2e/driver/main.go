// cnidriver: a small libcni client (like cnitool) for pycni's end-to-end tests and benchmarks.
//
//	cnidriver add|check|del CONFLIST CONTAINERID NETNS IFNAME
//	cnidriver cycle CONFLIST CONTAINERID NETNS IFNAME [N]
//	cnidriver version PLUGIN
//
// add prints the result JSON on stdout; check and del print nothing on success. cycle runs N (default 1)
// ADD+DEL pairs and prints one JSON line per pair with the time each call took inside libcni
// ({"add_ms":..,"del_ms":..}), so the benchmark measures plugin executions, not the driver's own start.
// Any failure prints an error object {"code","msg","details"} on stdout and exits 1; the code is the
// plugin's own when libcni passes a plugin error up (libcni wraps it, the message keeps libcni's prefix).
//
// gc and status exist in spec 1.1.0, but libcni gained GCNetworkList and GetStatusNetworkList only in
// v1.2.0. Debian 12 ships golang-github-appc-cni-dev 1.1.2, so these verbs exit 3 with that explanation.
//
// Environment: CNI_PATH (plugin dirs, ':'-separated), CNI_CACHE_DIR (libcni result cache; default
// /var/lib/cni), CNI_ARGS (extra K=V;.. pairs), CAP_ARGS (JSON object of capability args, e.g. {"mac": ".."}).
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
)

const usage = "usage: cnidriver add|check|del CONFLIST CONTAINERID NETNS IFNAME | " +
	"cycle CONFLIST CONTAINERID NETNS IFNAME [N] | version PLUGIN"

func fail(err error) {
	obj := map[string]interface{}{"code": 999, "msg": err.Error()}
	var perr *types.Error
	if errors.As(err, &perr) {
		obj["code"] = perr.Code
		obj["details"] = perr.Details
	}
	out, _ := json.Marshal(obj)
	fmt.Println(string(out))
	os.Exit(1)
}

func loadList(path string) (*libcni.NetworkConfigList, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var probe map[string]interface{}
	if err := json.Unmarshal(data, &probe); err != nil {
		return nil, err
	}
	if _, ok := probe["plugins"]; ok {
		return libcni.ConfListFromBytes(data)
	}
	conf, err := libcni.ConfFromBytes(data)
	if err != nil {
		return nil, err
	}
	return libcni.ConfListFromConf(conf)
}

func runtimeConf(cid, netns, ifname string) (*libcni.RuntimeConf, error) {
	rt := &libcni.RuntimeConf{ContainerID: cid, NetNS: netns, IfName: ifname}
	if args := os.Getenv("CNI_ARGS"); args != "" {
		for _, pair := range strings.Split(args, ";") {
			kv := strings.SplitN(pair, "=", 2)
			if len(kv) != 2 {
				return nil, fmt.Errorf("invalid CNI_ARGS pair %q", pair)
			}
			rt.Args = append(rt.Args, [2]string{kv[0], kv[1]})
		}
	}
	if caps := os.Getenv("CAP_ARGS"); caps != "" {
		if err := json.Unmarshal([]byte(caps), &rt.CapabilityArgs); err != nil {
			return nil, fmt.Errorf("CAP_ARGS: %v", err)
		}
	}
	return rt, nil
}

func version(plugin string) {
	cfg := libcni.NewCNIConfig(filepath.SplitList(os.Getenv("CNI_PATH")), nil)
	info, err := cfg.GetVersionInfo(context.Background(), plugin)
	if err != nil {
		fail(err)
	}
	out, _ := json.Marshal(map[string]interface{}{"supportedVersions": info.SupportedVersions()})
	fmt.Println(string(out))
}

func millis(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// cycle runs n ADD+DEL pairs and prints the duration of each call.
func cycle(cfg *libcni.CNIConfig, list *libcni.NetworkConfigList, rt *libcni.RuntimeConf, n int) {
	ctx := context.Background()
	for i := 0; i < n; i++ {
		start := time.Now()
		if _, err := cfg.AddNetworkList(ctx, list, rt); err != nil {
			fail(err)
		}
		added := time.Now()
		if err := cfg.DelNetworkList(ctx, list, rt); err != nil {
			fail(err)
		}
		out, _ := json.Marshal(map[string]float64{
			"add_ms": millis(added.Sub(start)), "del_ms": millis(time.Since(added)),
		})
		fmt.Println(string(out))
	}
}

func main() {
	if len(os.Args) >= 2 && (os.Args[1] == "gc" || os.Args[1] == "status") {
		fmt.Fprintf(os.Stderr, "cnidriver %s: not available: libcni 1.1.2 (Debian golang-github-appc-cni-dev) "+
			"has no GCNetworkList/GetStatusNetworkList; both arrived in libcni v1.2.0 (spec 1.1.0)\n", os.Args[1])
		os.Exit(3)
	}
	if len(os.Args) == 3 && os.Args[1] == "version" {
		version(os.Args[2])
		return
	}
	if len(os.Args) != 6 && !(len(os.Args) == 7 && os.Args[1] == "cycle") {
		fmt.Fprintln(os.Stderr, usage)
		os.Exit(2)
	}
	list, err := loadList(os.Args[2])
	if err != nil {
		fail(err)
	}
	rt, err := runtimeConf(os.Args[3], os.Args[4], os.Args[5])
	if err != nil {
		fail(err)
	}
	cfg := libcni.NewCNIConfigWithCacheDir(filepath.SplitList(os.Getenv("CNI_PATH")), os.Getenv("CNI_CACHE_DIR"), nil)
	ctx := context.Background()
	switch os.Args[1] {
	case "add":
		res, err := cfg.AddNetworkList(ctx, list, rt)
		if err != nil {
			fail(err)
		}
		if err := res.Print(); err != nil {
			fail(err)
		}
	case "check":
		if err := cfg.CheckNetworkList(ctx, list, rt); err != nil {
			fail(err)
		}
	case "del":
		if err := cfg.DelNetworkList(ctx, list, rt); err != nil {
			fail(err)
		}
	case "cycle":
		n := 1
		if len(os.Args) == 7 {
			if n, err = strconv.Atoi(os.Args[6]); err != nil || n < 1 {
				fmt.Fprintln(os.Stderr, "cycle: N must be a positive integer")
				os.Exit(2)
			}
		}
		cycle(cfg, list, rt, n)
	default:
		fmt.Fprintln(os.Stderr, "unknown command", os.Args[1])
		fmt.Fprintln(os.Stderr, usage)
		os.Exit(2)
	}
}
