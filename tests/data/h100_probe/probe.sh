set -x
nvidia-smi; nvidia-smi -L
F=timestamp,index,uuid,name,power.draw,power.draw.instant,power.draw.average,clocks.sm,clocks.mem,temperature.gpu,utilization.gpu,utilization.memory,power.limit,power.min_limit,power.max_limit,power.default_limit,enforced.power.limit,clocks.max.sm,driver_version,pstate
nvidia-smi --query-gpu=$F --format=csv,nounits
nvidia-smi --query-gpu=$F --format=csv
nvidia-smi --query-gpu=power.draw.bogus --format=csv; echo rc=$?
nvidia-smi --query-supported-clocks=mem,gr --format=csv,nounits | head -5
nvidia-smi --query-gpu=timestamp,power.draw,power.draw.instant,clocks.sm,clocks.mem,temperature.gpu,utilization.gpu --format=csv,nounits -lms 20 -f $OUT/trace.csv &
NPID=$!
sleep 0.5
python3 - <<'EOF'
import torch,time,pynvml,os,json
print(torch.__version__, torch.version.cuda, torch.cuda.get_device_name(0))
p=torch.cuda.get_device_properties(0); print(p, getattr(p,'uuid',None), getattr(p,'L2_cache_size',None))
pynvml.nvmlInit(); h=pynvml.nvmlDeviceGetHandleByIndex(0)
print(pynvml.nvmlDeviceGetUUID(h), pynvml.nvmlDeviceGetTotalEnergyConsumption(h))
a=torch.randn(8192,8192,device='cuda'); b=torch.randn(8192,8192,device='cuda')
time.sleep(1.0)
ts=[]
for k in range(3):
  e0=pynvml.nvmlDeviceGetTotalEnergyConsumption(h); s=time.time()
  while time.time()-s<1.0:
    c=a@b
  torch.cuda.synchronize(); e1=pynvml.nvmlDeviceGetTotalEnergyConsumption(h)
  ts.append((s,time.time(),e0,e1)); time.sleep(0.7)
vals=[];s=time.time()
while time.time()-s<0.5:
  vals.append((time.time(),pynvml.nvmlDeviceGetTotalEnergyConsumption(h)))
ch=[v for i,v in enumerate(vals) if i==0 or v[1]!=vals[i-1][1]]
print('counter changes in .5s idle', len(ch), [round(c[0]-s,3) for c in ch])
print(json.dumps(ts)); print('tz', time.localtime().tm_gmtoff, time.tzname)
t=time.time(); import torchvision; print('import tv', time.time()-t)
EOF
sleep 0.5; kill $NPID; sleep 0.3; wc -l $OUT/trace.csv; head -5 $OUT/trace.csv
python3 -c "import torchvision,sklearn,pandas,pyarrow,matplotlib;print(torchvision.__version__,sklearn.__version__,pandas.__version__,pyarrow.__version__)"
time python3 -c "import torch"
time python3 -c "import torch; torch.zeros(1,device='cuda')"
nproc; hostname; date; python3 --version
