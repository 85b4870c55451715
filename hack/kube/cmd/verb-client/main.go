// Command verb-client is bench/verbcost.py's kube-scheduler: it calls an
// extender's filter or prioritize through kube-scheduler's own HTTPExtender
// (k8s.io/kubernetes/pkg/scheduler, the pinned module), one call after the
// other on one kept-alive connection, for a plain pod and a list of nodes as
// kube-scheduler would send them (NodeNames: nodeCacheCapable). It reports
// its own CPU time and each call's latency, so that what one call costs
// kube-scheduler (JSON both ways, net/http) can be read apart from the noise
// of a whole scheduling run.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"sort"
	"syscall"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler"
	schedulerapi "k8s.io/kubernetes/pkg/scheduler/apis/config"
	"k8s.io/kubernetes/pkg/scheduler/framework"
)

// Result is what the command prints, as one JSON object.
type Result struct {
	Calls       int     `json:"calls"`
	WallSeconds float64 `json:"wall_seconds"`
	CPUSeconds  float64 `json:"cpu_seconds"`
	P50Seconds  float64 `json:"p50_seconds"`
	P99Seconds  float64 `json:"p99_seconds"`
}

func cpuSeconds() float64 {
	var usage syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &usage); err != nil {
		return 0
	}
	seconds := func(t syscall.Timeval) float64 { return float64(t.Sec) + float64(t.Usec)/1e6 }
	return seconds(usage.Utime) + seconds(usage.Stime)
}

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "verb-client: "+format+"\n", args...)
	os.Exit(1)
}

func main() {
	url := flag.String("url", "", "the extender's urlPrefix, e.g. http://127.0.0.1:8888/scheduler")
	verb := flag.String("verb", "filter", "filter or prioritize")
	nodes := flag.Int("nodes", 230, "node names per call (node-1 ... node-N)")
	calls := flag.Int("calls", 2000, "calls to make")
	warmup := flag.Int("warmup", 50, "calls made first and not counted")
	flag.Parse()
	if *url == "" || (*verb != "filter" && *verb != "prioritize") || *nodes < 1 || *calls < 1 {
		fail("need --url, --verb filter|prioritize, --nodes >= 1 and --calls >= 1")
	}
	extender, err := scheduler.NewHTTPExtender(&schedulerapi.Extender{
		URLPrefix:        *url,
		FilterVerb:       "filter",
		PrioritizeVerb:   "prioritize",
		Weight:           1,
		NodeCacheCapable: true,
		HTTPTimeout:      metav1.Duration{Duration: 30 * time.Second},
	})
	if err != nil {
		fail("%v", err)
	}
	pod := &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "verb-client", Namespace: "default", UID: types.UID("verb-client-uid")},
		Spec: v1.PodSpec{
			SchedulerName: "default-scheduler",
			Containers: []v1.Container{{
				Name:  "pause",
				Image: "registry.k8s.io/pause:3.10",
				Resources: v1.ResourceRequirements{Requests: v1.ResourceList{
					v1.ResourceCPU:    resource.MustParse("100m"),
					v1.ResourceMemory: resource.MustParse("64Mi"),
				}},
			}},
		},
	}
	infos := make([]fwk.NodeInfo, *nodes)
	for i := range infos {
		info := framework.NewNodeInfo()
		info.SetNode(&v1.Node{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("node-%d", i+1)}})
		infos[i] = info
	}
	call := func() {
		if *verb == "filter" {
			passed, _, _, err := extender.Filter(pod, infos)
			if err != nil {
				fail("filter: %v", err)
			}
			if len(passed) == 0 {
				fail("filter passed no node: is the pod in a gang, or the nodes unknown?")
			}
			return
		}
		if _, _, err := extender.Prioritize(pod, infos); err != nil {
			fail("prioritize: %v", err)
		}
	}
	for i := 0; i < *warmup; i++ {
		call()
	}
	latencies := make([]float64, *calls)
	cpuBefore, started := cpuSeconds(), time.Now()
	for i := range latencies {
		start := time.Now()
		call()
		latencies[i] = time.Since(start).Seconds()
	}
	result := Result{Calls: *calls, WallSeconds: time.Since(started).Seconds(), CPUSeconds: cpuSeconds() - cpuBefore}
	sort.Float64s(latencies)
	result.P50Seconds = latencies[len(latencies)/2]
	result.P99Seconds = latencies[len(latencies)*99/100]
	if err := json.NewEncoder(os.Stdout).Encode(result); err != nil {
		fail("%v", err)
	}
}
