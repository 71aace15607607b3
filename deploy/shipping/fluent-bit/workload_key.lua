-- Fluent Bit Lua filter: set record["workload_key"] = "namespace/workload" (the Kafka key).
--
-- The kafka output sends it as the message key (message_key_field workload_key), so that
-- every record of a workload lands on the same partition number of every topic.
-- The workload is named as the detector names it (detector/correlate/identity.py,
-- classify_pod), from the kubernetes filter's metadata (kubernetes.namespace_name, pod_name,
-- labels): the controller labels (LeaderWorkerSet, KServe, Ray), an Argo Rollout's
-- rollouts-pod-template-hash, a ReplicaSet's pod-template-hash, a StatefulSet's pod-name
-- label, a DaemonSet's pod-template-generation, then the pod name's shape.
-- An ingress-nginx access line is keyed by its upstream (<namespace>-<service>-<port>,
-- the upstreaminfo format's $proxy_upstream_name) when <namespace> is one of the
-- comma-separated UPSTREAM_NAMESPACES (environment variable).
-- Filter API: https://docs.fluentbit.io/manual/pipeline/filters/lua (return 2: record
-- modified, timestamp kept; 0: unchanged).

local CONTROLLER_LABELS = {
  "leaderworkerset.sigs.k8s.io/name",
  "serving.kserve.io/inferenceservice",
  "ray.io/cluster",
}
-- a ReplicaSet's hash: 5 to 10 of these characters (k8s.io/apimachinery rand.SafeEncodeString)
local HASH_CHARS = "^[bcdfghjklmnpqrstvwxz2456789]+$"

local function upstream_namespaces()
  local out = {}
  for ns in string.gmatch(os.getenv("UPSTREAM_NAMESPACES") or "", "[^,%s]+") do
    out[#out + 1] = ns
  end
  table.sort(out, function(a, b) return #a > #b end) -- longest first: "llm-prod" before "llm"
  return out
end
local NAMESPACES = upstream_namespaces()

-- the text before the last occurrence of "-" .. hash .. "-" in pod, or nil
local function before_hash(pod, hash)
  local mark, last = "-" .. hash .. "-", nil
  local from = 1
  while true do
    local at = string.find(pod, mark, from, true)
    if at == nil then break end
    last, from = at, at + 1
  end
  return last and string.sub(pod, 1, last - 1) or nil
end

local function is_hash(s, min, max)
  return #s >= min and #s <= max and string.find(s, HASH_CHARS) ~= nil
end

-- the Deployment name of a pod named <deployment>-<rs hash>-<5 chars>, or nil
local function deployment_of(pod)
  local head, hash, tail = string.match(pod, "^(.+)%-([^-]+)%-([a-z0-9]+)$")
  if head and #tail == 5 and is_hash(hash, 5, 10) then return head end
  return nil
end

local function workload_of(pod, labels)
  for _, label in ipairs(CONTROLLER_LABELS) do
    local name = labels[label]
    if type(name) == "string" and name ~= "" then return name end
  end
  for _, label in ipairs({"rollouts-pod-template-hash", "pod-template-hash"}) do
    local hash = labels[label]
    if type(hash) == "string" and hash ~= "" then
      local name = before_hash(pod, hash)
      if name then return name end
    end
  end
  local ordinal = string.match(pod, "^(.+)%-%d+$")
  if labels["statefulset.kubernetes.io/pod-name"] and ordinal then return ordinal end
  if labels["pod-template-generation"] then
    local head, tail = string.match(pod, "^(.+)%-([^-]+)$")
    if head and is_hash(tail, 5, 5) then return head end
  end
  return deployment_of(pod) or ordinal or pod
end

-- "<namespace>/<service>" of an ingress-nginx upstreaminfo access line, or nil
local function upstream_key(line)
  if type(line) ~= "string" or #NAMESPACES == 0 then return nil end
  local upstream = string.match(line, " [%d.-]+ %[([%w.-]+)%] %[")
  if upstream == nil then return nil end
  local service = string.match(upstream, "^(.+)%-[%w]+$") -- without the port
  if service == nil then return nil end
  for _, ns in ipairs(NAMESPACES) do
    if #service > #ns + 1 and string.sub(service, 1, #ns + 1) == ns .. "-" then
      return ns .. "/" .. string.sub(service, #ns + 2)
    end
  end
  return nil
end

function workload_key(tag, timestamp, record)
  local k8s = record["kubernetes"]
  if type(k8s) ~= "table" then return 0, timestamp, record end
  local key = upstream_key(record["log"])
  if key == nil then
    local ns, pod = k8s["namespace_name"], k8s["pod_name"]
    if type(ns) ~= "string" or type(pod) ~= "string" then return 0, timestamp, record end
    local labels = type(k8s["labels"]) == "table" and k8s["labels"] or {}
    key = ns .. "/" .. workload_of(pod, labels)
  end
  record["workload_key"] = key
  return 2, timestamp, record
end
