// Command noop-extender is bench/e2e.py's yardstick: a kube-scheduler extender
// that decides nothing. Filter passes every node, prioritize scores none, bind
// creates the pods/binding at once. Built from the same pinned module graph as
// the control plane (hack/build-kube), in Go with its multi-threaded net/http
// server, it measures what the extender protocol itself costs kube-scheduler
// (two round trips per pod plus a bind call, JSON both ways) on this machine,
// apart from what gang-extender does in them.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net/http"
	"os"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"
)

func main() {
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig of the cluster to bind pods in")
	address := flag.String("address", "127.0.0.1:18890", "where to serve the verbs")
	qps := flag.Float64("qps", 2000, "client QPS and burst, as the bench gives kube-scheduler")
	flag.Parse()
	config, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		fmt.Fprintf(os.Stderr, "noop-extender: cannot load --kubeconfig %q: %v\n", *kubeconfig, err)
		os.Exit(2)
	}
	config.QPS = float32(*qps)
	config.Burst = int(*qps)
	client := kubernetes.NewForConfigOrDie(config)

	mux := http.NewServeMux()
	mux.HandleFunc("POST /scheduler/filter", func(w http.ResponseWriter, r *http.Request) {
		var args extenderv1.ExtenderArgs
		if !decode(w, r, &args) {
			return
		}
		answer(w, &extenderv1.ExtenderFilterResult{NodeNames: args.NodeNames})
	})
	mux.HandleFunc("POST /scheduler/prioritize", func(w http.ResponseWriter, r *http.Request) {
		var args extenderv1.ExtenderArgs
		if !decode(w, r, &args) {
			return
		}
		answer(w, &extenderv1.HostPriorityList{})
	})
	mux.HandleFunc("POST /scheduler/bind", func(w http.ResponseWriter, r *http.Request) {
		var args extenderv1.ExtenderBindingArgs
		if !decode(w, r, &args) {
			return
		}
		ctx, cancel := context.WithTimeout(r.Context(), 30*time.Second)
		defer cancel()
		binding := &v1.Binding{
			ObjectMeta: metav1.ObjectMeta{Namespace: args.PodNamespace, Name: args.PodName, UID: args.PodUID},
			Target:     v1.ObjectReference{Kind: "Node", Name: args.Node},
		}
		result := extenderv1.ExtenderBindingResult{}
		if err := client.CoreV1().Pods(args.PodNamespace).Bind(ctx, binding, metav1.CreateOptions{}); err != nil {
			result.Error = err.Error()
		}
		answer(w, &result)
	})
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte("ok"))
	})
	fmt.Fprintf(os.Stderr, "noop-extender: serving on %s\n", *address)
	if err := http.ListenAndServe(*address, mux); err != nil {
		fmt.Fprintf(os.Stderr, "noop-extender: %v\n", err)
		os.Exit(1)
	}
}

func decode(w http.ResponseWriter, r *http.Request, into any) bool {
	if err := json.NewDecoder(r.Body).Decode(into); err != nil {
		http.Error(w, fmt.Sprintf("bad request body: %v", err), http.StatusBadRequest)
		return false
	}
	return true
}

func answer(w http.ResponseWriter, result any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(result)
}
