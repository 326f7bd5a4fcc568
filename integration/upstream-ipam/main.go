// upstream-ipam: upstream aws-node v1.23's checkpoint facts in Go's own standard library, for the
// migration tests (integration/src/upstream_node.rs, docs/migration.md). The structs carry the
// JSON field names, types and omission rules of upstream's CheckpointData / CheckpointEntry /
// IPAMKey / IPAMMetadata (pkg/ipamd/datastore/data_store.go); the I/O mirrors what upstream's
// JSONFile checkpointer does (json.Encoder.Encode when writing, json.Decoder.Decode when
// restoring). Written from those facts, not copied. Standard library only.
//
//	upstream-ipam write <ipam.json>          stdin: JSON list of pods; writes the checkpoint as
//	                                         upstream does, prints the pods' host veth names
//	upstream-ipam read <ipam.json> <link>... restores the checkpoint as upstream's
//	                                         ReadBackingStore does (version check, veth-existence
//	                                         filter over the given host links) and prints the
//	                                         entries upstream would keep, as JSON
package main

import (
	"crypto/sha1"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"
)

const checkpointFormatVersion = "vpc-cni-ipam/1"

type ipamKey struct {
	NetworkName string `json:"networkName"`
	ContainerID string `json:"containerID"`
	IfName      string `json:"ifName"`
}

type ipamMetadata struct {
	K8SPodNamespace string `json:"k8sPodNamespace,omitempty"`
	K8SPodName      string `json:"k8sPodName,omitempty"`
	InterfacesCount int    `json:"interfacesCount,omitempty"`
}

type checkpointEntry struct {
	ipamKey
	IPv4                string       `json:"ipv4,omitempty"`
	IPv6                string       `json:"ipv6,omitempty"`
	AllocationTimestamp int64        `json:"allocationTimestamp"`
	Metadata            ipamMetadata `json:"metadata"`
}

type checkpointData struct {
	Version     string            `json:"version"`
	Allocations []checkpointEntry `json:"allocations"`
}

// One pod of the fixture (the test's input to "write").
type pod struct {
	ContainerID         string `json:"containerID"`
	Namespace           string `json:"namespace"`
	Name                string `json:"name"`
	IPv4                string `json:"ipv4"`
	AllocationTimestamp int64  `json:"allocationTimestamp"`
	// A multi-NIC pod's entry (one per network card's file): upstream's InterfacesCount.
	InterfacesCount int `json:"interfacesCount"`
}

// What "read" reports per kept entry: the restored values as upstream's types hold them.
type restored struct {
	ContainerID string `json:"containerID"`
	IfName      string `json:"ifName"`
	NetworkName string `json:"networkName"`
	Namespace   string `json:"namespace"`
	Name        string `json:"name"`
	IPv4        string `json:"ipv4"`
	Allocated   string `json:"allocated"`
	Veth        string `json:"veth"`
}

// upstream's GeneratePodHostVethNameSuffix: first 11 hex of sha1("<namespace>.<name>").
func vethSuffix(namespace, name string) string {
	h := sha1.New()
	h.Write([]byte(fmt.Sprintf("%s.%s", namespace, name)))
	return hex.EncodeToString(h.Sum(nil))[:11]
}

func fail(format string, args ...interface{}) {
	fmt.Fprintf(os.Stderr, "upstream-ipam: "+format+"\n", args...)
	os.Exit(1)
}

func write(path string) {
	var pods []pod
	if err := json.NewDecoder(os.Stdin).Decode(&pods); err != nil {
		fail("stdin: %v", err)
	}
	data := checkpointData{Version: checkpointFormatVersion}
	names := []string{}
	for _, p := range pods {
		data.Allocations = append(data.Allocations, checkpointEntry{
			ipamKey:             ipamKey{NetworkName: "aws-cni", ContainerID: p.ContainerID, IfName: "eth0"},
			IPv4:                p.IPv4,
			AllocationTimestamp: p.AllocationTimestamp,
			Metadata:            ipamMetadata{K8SPodNamespace: p.Namespace, K8SPodName: p.Name, InterfacesCount: p.InterfacesCount},
		})
		names = append(names, "eni"+vethSuffix(p.Namespace, p.Name))
	}
	// As upstream's JSONFile.Checkpoint: temp file in the same directory, Encode, Sync, Rename.
	f, err := os.CreateTemp(filepath.Dir(path), filepath.Base(path)+".tmp*")
	if err != nil {
		fail("%v", err)
	}
	var anyData interface{} = data
	if err := json.NewEncoder(f).Encode(&anyData); err != nil {
		fail("%v", err)
	}
	if err := f.Sync(); err != nil {
		fail("%v", err)
	}
	f.Close()
	if err := os.Rename(f.Name(), path); err != nil {
		fail("%v", err)
	}
	if err := json.NewEncoder(os.Stdout).Encode(names); err != nil {
		fail("%v", err)
	}
}

func read(path string, links []string) {
	f, err := os.Open(path)
	if err != nil {
		fail("%v", err)
	}
	defer f.Close()
	var data checkpointData
	if err := json.NewDecoder(f).Decode(&data); err != nil {
		fail("restore %s: %v", path, err)
	}
	if data.Version != checkpointFormatVersion {
		fail("unexpected checkpointVersion: %v/%v", data.Version, checkpointFormatVersion)
	}
	checkFieldNames(path)
	out := []restored{}
	for _, a := range data.Allocations {
		veth := ""
		// upstream's validateAllocationByPodVethExistence: entries without pod metadata are
		// kept; others need a host link whose name ends with the pod's suffix.
		if a.Metadata.K8SPodNamespace != "" && a.Metadata.K8SPodName != "" {
			suffix := vethSuffix(a.Metadata.K8SPodNamespace, a.Metadata.K8SPodName)
			for _, l := range links {
				if strings.HasSuffix(l, suffix) {
					veth = l
				}
			}
			if veth == "" {
				fmt.Fprintf(os.Stderr, "stale allocation %s %s: no host veth\n", a.ContainerID, a.IPv4)
				continue
			}
		}
		if net.ParseIP(a.IPv4) == nil {
			fail("entry %s: ipv4 %q does not parse", a.ContainerID, a.IPv4)
		}
		out = append(out, restored{
			ContainerID: a.ContainerID, IfName: a.IfName, NetworkName: a.NetworkName,
			Namespace: a.Metadata.K8SPodNamespace, Name: a.Metadata.K8SPodName, IPv4: a.IPv4,
			Allocated: time.Unix(0, a.AllocationTimestamp).UTC().Format(time.RFC3339Nano), Veth: veth,
		})
	}
	if err := json.NewEncoder(os.Stdout).Encode(out); err != nil {
		fail("%v", err)
	}
}

// upstream decodes without DisallowUnknownFields, so a misspelt field would silently restore
// as empty: every key must be one of upstream's.
func checkFieldNames(path string) {
	raw, err := os.ReadFile(path)
	if err != nil {
		fail("%v", err)
	}
	var doc struct {
		Allocations []map[string]json.RawMessage `json:"allocations"`
	}
	if err := json.Unmarshal(raw, &doc); err != nil {
		fail("%v", err)
	}
	entryKeys := map[string]bool{"networkName": true, "containerID": true, "ifName": true,
		"ipv4": true, "ipv6": true, "allocationTimestamp": true, "metadata": true}
	metaKeys := map[string]bool{"k8sPodNamespace": true, "k8sPodName": true, "interfacesCount": true}
	for _, e := range doc.Allocations {
		for k := range e {
			if !entryKeys[k] {
				fail("entry field %q is not upstream's", k)
			}
		}
		var meta map[string]json.RawMessage
		if err := json.Unmarshal(e["metadata"], &meta); err != nil {
			fail("metadata: %v", err)
		}
		for k := range meta {
			if !metaKeys[k] {
				fail("metadata field %q is not upstream's", k)
			}
		}
	}
}

func main() {
	if len(os.Args) < 3 {
		fail("usage: upstream-ipam write <ipam.json> | read <ipam.json> <host link>...")
	}
	switch os.Args[1] {
	case "write":
		write(os.Args[2])
	case "read":
		read(os.Args[2], os.Args[3:])
	default:
		fail("unknown command %q", os.Args[1])
	}
}
