// cnidriver: a small libcni client (like cnitool) for pycni's end-to-end tests and benchmarks.
//
//	cnidriver add|check|del|version CONFLIST CONTAINERID NETNS IFNAME
//
// Environment: CNI_PATH (plugin dirs, ':'-separated), CNI_CACHE_DIR (libcni result cache),
// CNI_ARGS (extra K=V;.. pairs), CAP_ARGS (JSON object of capability args, e.g. {"mac": ".."}),
// CNI_REPEAT (run the command N times; used by the benchmark to amortise nothing but process start).
// ADD prints the result JSON on stdout; errors print the CNI error JSON on stdout and exit 1.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
)

func fail(err error) {
	if e, ok := err.(*types.Error); ok {
		out, _ := json.Marshal(e)
		fmt.Println(string(out))
	} else {
		out, _ := json.Marshal(map[string]interface{}{"code": 999, "msg": err.Error()})
		fmt.Println(string(out))
	}
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

func main() {
	if len(os.Args) == 3 && os.Args[1] == "version" {
		cfg := libcni.NewCNIConfig(filepath.SplitList(os.Getenv("CNI_PATH")), nil)
		info, err := cfg.GetVersionInfo(context.Background(), os.Args[2])
		if err != nil {
			fail(err)
		}
		out, _ := json.Marshal(map[string]interface{}{"supportedVersions": info.SupportedVersions()})
		fmt.Println(string(out))
		return
	}
	if len(os.Args) != 6 {
		fmt.Fprintln(os.Stderr, "usage: cnidriver add|check|del CONFLIST CONTAINERID NETNS IFNAME | version PLUGIN")
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
	cacheDir := os.Getenv("CNI_CACHE_DIR")
	cfg := libcni.NewCNIConfigWithCacheDir(filepath.SplitList(os.Getenv("CNI_PATH")), cacheDir, nil)
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
	default:
		fmt.Fprintln(os.Stderr, "unknown command", os.Args[1])
		os.Exit(2)
	}
}
