"""Run a real local Kubernetes control plane on loopback for tests and demos.

gang-extender is a kube-scheduler extender, so the only convincing test is the
real kube-scheduler calling it against a real API server. This package starts
etcd, kube-apiserver, kube-controller-manager and kube-scheduler (built by
hack/build-kube at the pinned version) as background processes bound to
127.0.0.1, with working certificate authentication and Node,RBAC
authorization, and registers fake Node objects (no kubelet) for the scheduler
to place pods on. A pod simulator plays the kubelet of those nodes, so bound
pods run, finish and go away when deleted.

It is deliberately stdlib-only (plus the openssl CLI for certificates) so that
it runs on a bare CI machine without Docker, kind or a virtualenv.

Entry point: ``cli.main()`` (wrapped by the executable ``hack/local-cluster``).
Everything it creates lives in one state directory (``<repo>/.local-cluster``
or ``$LOCAL_CLUSTER_DIR``), so ``down`` can undo exactly what ``up`` did.

One job per module: ``layout`` (paths and ports: the ``Config`` the CLI builds
once and passes down), ``report`` (progress and errors), ``state`` (lock and
state.json), ``toolchain`` (pinned binaries, kubectl, CRDs), ``pki``
(certificates, kubeconfigs), ``components`` (command lines, feature gates),
``scheduler_config`` (KubeSchedulerConfiguration rendering), ``supervise``
(start, stop, health), ``api`` (a small HTTP client), ``nodes`` (fake nodes),
``podsim`` (the pod simulator), ``commands`` (up/down/status/add-node) and
``cli`` (argparse).
"""
