"""The read model: one incident document, built from the store, for every face.

``read`` loads incidents and verdicts from the store; ``document`` turns them into the JSON
document that ``detector replay --json`` and ``detector incidents --json`` print (and that the
console report, Slack, the web page and the postmortem read).
"""
