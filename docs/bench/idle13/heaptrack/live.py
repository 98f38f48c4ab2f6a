import re,sys
rows=[]
for l in open(sys.argv[1]).read().splitlines():
    st,_,c=l.rpartition(' ')
    rows.append((int(c),st.split(';')))
n=int(sys.argv[2])
def clean(f):
    f=re.sub(r'::h[0-9a-f]{16}','',f).replace('$LT$','<').replace('$GT$','>').replace('$C$',',').replace('$u20$',' ').replace('..','::').replace('$u7b$','{').replace('$u7d$','}').replace('$RF$','&')
    return re.sub(r' \(.*\)$','',f)
agg={}
for c,fr in rows:
    fr=[clean(f) for f in fr]
    inner=[f for f in fr[::-1] if re.search(r'herald|tokio_websockets|hyper::|rustls::|tokio::runtime::(io|task)',f)]
    key=' <- '.join(inner[:2])
    agg[key]=agg.get(key,0)+c
print("total %.0f B/conn"%(sum(agg.values())/n))
for k,c in sorted(agg.items(),key=lambda x:-x[1])[:20]:
    print("%6.0f  %s"%(c/n,k[:230]))
