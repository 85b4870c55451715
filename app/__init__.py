"""gang-extender: all-or-nothing (gang) scheduling as a kube-scheduler extender."""

__version__ = "0.1.0"
