"""The HTTP face: the extender's wire types, the four verbs, and the webhook.

kube-scheduler and kube-apiserver reach the service only through here; each
route decodes, asks the runtime, and encodes. No decision is made in this layer.
"""
