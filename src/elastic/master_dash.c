/*
 * master_dash.c - the straggler Monitor and Controller on the master, and the live dashboard.
 *
 *   POST /v1/straggler/report  one step of a data-parallel world, as its rank 0 saw it:
 *        {"generation", "step", "compute_s": [per rank], "samples": [per rank], "split": [local
 *         batches], "loss", "phase": "train"|"eval"|"ckpt", "remaining_steps"}
 *        -> {"split": [...], "action": null | {"kind", "rank", "step", "gain", "why"}}
 *        The trainer applies the split it gets back at the next step boundary.
 *   GET  /v1/straggler         policy, config, every rank's state and speed, the split, the
 *        last actions and the loss curve.
 *   GET  /dashboard            an HTML page that polls the JSON endpoints every second and shows
 *        workers and speeds, straggler states and actions, shard progress, the loss curve, the
 *        plan and the generation.
 *
 * ND's restart of a persistent straggler: the agent that runs the rank is put on cooldown (the
 * blacklist's mechanism, without counting a failure) and the world is asked to stop at a step
 * boundary; the next generation forms without that node when others can run, and restores the
 * checkpoint of the stop, so nothing is lost. Without a world (a trainer under mpiexec reporting
 * here) the decision is recorded and the split returned. A parameter server the servers' monitor
 * finds persistently slow is restarted the same way, when ND's rule finds it pays.
 *
 * Everything runs under the master's mutex (adt_master_handle holds it).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "adtrain/straggler.h"
#include "elastic/wire_internal.h"
#include "master_internal.h"

#define LOSS_MAX 2048 /* points kept of the loss curve: halved (every other) when full */
#define ACT_MAX 64
#define RING 8 /* steps whose compute reports are being gathered at once */

typedef struct dash_action {
    int64_t generation;
    adt_straggler_action a;
    double wall;
    int applied; /* a restart that the master carried out */
    int server;  /* the rank is a parameter server's (the servers' monitor's restart) */
} dash_action;

struct m_strag {
    adt_straggler_cfg cfg;
    adt_straggler *mon;
    int n;
    int lo;       /* the monitor's rank i is replica lo + i (replicas below lo take no samples) */
    int64_t gen;
    long step;
    int64_t *split, *samples;
    double *compute_s;
    double loss_step[LOSS_MAX], loss_val[LOSS_MAX];
    int n_loss, loss_stride;
    dash_action act[ACT_MAX];
    int64_t n_act; /* all time; the last ACT_MAX kept */

    /* The split of the elastic world of generation sp_gen (0: not made yet). */
    int64_t sp_gen;
    wj_split sp;           /* n = 0: the master drives none                              */
    int64_t sp_observed;   /* the last step given to the monitor                         */
    int64_t idle_gen;      /* the generation whose reports without compute times were logged */
    /* compute reports being gathered: RING steps x sp.n replicas */
    int64_t ring_step[RING];
    int ring_count[RING];
    double *ring_c;
    int64_t *ring_n;
    unsigned char *ring_got;

    /* The servers (idle replicas 0 .. lo-1) judged by their answer times: a monitor of its own,
     * classification only (the controller has nothing to split among them); with 2 or more. */
    adt_straggler *srv_mon;
    int n_srv;
    double *ring_srv;               /* RING x n replicas x n_srv answer seconds, < 0: not reported */
    double *srv_s;                  /* [n_srv] the last judged step's: mean over the replicas */
    adt_straggler_state *srv_state; /* [n_srv] as last logged                                  */
};

int m_dash_init(adt_master *m, const adt_master_config *c) {
    adt_straggler_policy p = ADT_STRAGGLER_OFF;
    if (c->straggler_policy && adt_straggler_policy_parse(c->straggler_policy, &p))
        return adt_error(ADT_ERR_ARG, "--straggler-policy: expected off, dd or nd, got '%s'", c->straggler_policy);
    m_strag *s = adt_calloc(1, sizeof *s);
    s->cfg = adt_straggler_defaults(p);
    if (c->straggler_config && adt_straggler_cfg_parse(&s->cfg, c->straggler_config)) {
        char why[512]; /* adt_error writes the buffer adt_error_message reads */
        snprintf(why, sizeof why, "%s", adt_error_message());
        free(s);
        return adt_error(ADT_ERR_ARG, "--straggler-config: %s", why);
    }
    s->loss_stride = 1;
    m->strag = s;
    return ADT_OK;
}

static void reset_world(m_strag *s, int n, int lo, int64_t gen) {
    adt_straggler_free(s->mon);
    s->lo = lo;
    free(s->split), free(s->samples), free(s->compute_s);
    s->mon = adt_straggler_create(n, &s->cfg);
    s->n = n, s->gen = gen;
    s->split = adt_calloc((size_t)n, sizeof *s->split);
    s->samples = adt_calloc((size_t)n, sizeof *s->samples);
    s->compute_s = adt_calloc((size_t)n, sizeof *s->compute_s);
}

void m_dash_free(adt_master *m) {
    m_strag *s = m->strag;
    if (!s) return;
    adt_straggler_free(s->mon);
    free(s->split), free(s->samples), free(s->compute_s);
    free(s->ring_c), free(s->ring_n), free(s->ring_got);
    adt_straggler_free(s->srv_mon);
    free(s->ring_srv), free(s->srv_s), free(s->srv_state);
    free(s);
    m->strag = NULL;
}

static void add_loss(m_strag *s, long step, double loss) {
    if (!isfinite(loss) || step % s->loss_stride) return;
    if (s->n_loss == LOSS_MAX) { /* keep every other point, take every other step from now on */
        for (int i = 0; i < LOSS_MAX / 2; i++) s->loss_step[i] = s->loss_step[2 * i], s->loss_val[i] = s->loss_val[2 * i];
        s->n_loss = LOSS_MAX / 2;
        s->loss_stride *= 2;
        if (step % s->loss_stride) return;
    }
    s->loss_step[s->n_loss] = (double)step, s->loss_val[s->n_loss++] = loss;
}

/* ND's restart: the node running `rank` sits out the next world (if others can run it). */
static int restart_elsewhere(adt_master *m, const adt_straggler_action *a) {
    if (m->gstate != G_RUNNING) return 0;
    for (int i = 0; i < m->n_slots; i++) {
        const m_slot *sl = &m->slots[i];
        if (a->rank < sl->rank_offset || a->rank >= sl->rank_offset + sl->local_size) continue;
        m_agent *ag = m_agent_find(m, sl->agent);
        if (!ag) return 0;
        /* a job with idle replicas (--mode ps: its servers) needs them and one working replica:
         * a node whose leaving would form a smaller world stays (that world would refuse to run) */
        if (m->idle > 0) {
            int others = 0, need = (m->idle + 1) * m->rpr;
            double now = adt_wall_s();
            for (int k = 0; k < m->n_agents; k++) {
                const m_agent *o = &m->agents[k];
                if (o != ag && o->alive && !o->leaving && o->cooldown_until <= now) others += o->slots;
            }
            if (others < need) {
                ms_event(m, "straggler", m->gen, ag->id, a->rank, "node %s not left out: the other nodes hold %d "
                         "ranks, fewer than the %d its %d idle replicas and one working replica need", ag->node,
                         others, need, m->idle);
                return 0;
            }
        }
        /* the blacklist's cooldown for the node's failures so far (no failure is counted) */
        double cool = m->cfg.cooldown_min_s * pow(2.0, ag->failures > 0 ? ag->failures - 1 : 0);
        if (cool > m->cfg.cooldown_max_s) cool = m->cfg.cooldown_max_s;
        ag->cooldown_until = adt_wall_s() + cool;
        ms_event(m, "straggler", m->gen, ag->id, a->rank, "node %s left out for %.0f s: %s", ag->node, cool, a->why);
        ms_save(m);
        m_request_stop(m, "straggler restart");
        return 1;
    }
    return 0;
}

static int num_array(const cJSON *b, const char *key, int n, double *out) {
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(b, key);
    if (!cJSON_IsArray(a) || (n >= 0 && cJSON_GetArraySize(a) != n)) return -1;
    int i = 0;
    const cJSON *x;
    cJSON_ArrayForEach(x, a) {
        if (!cJSON_IsNumber(x) || !isfinite(x->valuedouble) || x->valuedouble < 0) return -1;
        out[i++] = x->valuedouble;
    }
    return i;
}

static cJSON *action_json(const dash_action *d) {
    static const char *const kinds[] = {"none", "rebalance", "restart"};
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "kind", kinds[d->a.kind]);
    cJSON_AddNumberToObject(o, "generation", (double)d->generation);
    cJSON_AddNumberToObject(o, "step", (double)d->a.step);
    cJSON_AddNumberToObject(o, "rank", d->a.rank);
    cJSON_AddNumberToObject(o, "gain", d->a.gain);
    cJSON_AddStringToObject(o, "why", d->a.why);
    cJSON_AddNumberToObject(o, "time", d->wall);
    cJSON_AddBoolToObject(o, "applied", d->applied);
    cJSON_AddBoolToObject(o, "server", d->server);
    return o;
}

static void ep_report(adt_master *m, const adt_http_request *rq, adt_http_reply *rp) {
    m_strag *s = m->strag;
    cJSON *b = rq->body_len ? cJSON_ParseWithLength(rq->body, rq->body_len) : NULL;
    const cJSON *g = cJSON_GetObjectItemCaseSensitive(b, "generation"), *st = cJSON_GetObjectItemCaseSensitive(b, "step"),
                *ph = cJSON_GetObjectItemCaseSensitive(b, "phase"), *lo = cJSON_GetObjectItemCaseSensitive(b, "loss"),
                *rem = cJSON_GetObjectItemCaseSensitive(b, "remaining_steps");
    const cJSON *ca = cJSON_GetObjectItemCaseSensitive(b, "compute_s");
    int n = cJSON_IsArray(ca) ? cJSON_GetArraySize(ca) : 0;
    double comp[ADT_STRAGGLER_MAX_RANKS], smp[ADT_STRAGGLER_MAX_RANKS], spl[ADT_STRAGGLER_MAX_RANKS];
    const char *bad = !cJSON_IsObject(b) ? "expected a JSON object"
                    : !cJSON_IsNumber(g) || g->valuedouble < 0 ? "field 'generation': expected a number >= 0"
                    : !cJSON_IsNumber(st) || st->valuedouble < 1 ? "field 'step': expected a number >= 1"
                    : n < 1 || n > ADT_STRAGGLER_MAX_RANKS || num_array(b, "compute_s", n, comp) != n
                        ? "field 'compute_s': expected an array of 1..1024 seconds >= 0"
                    : num_array(b, "samples", n, smp) != n ? "field 'samples': expected as many counts as compute_s"
                    : num_array(b, "split", n, spl) != n ? "field 'split': expected as many local batches as compute_s"
                    : ph && !(cJSON_IsString(ph) && (!strcmp(ph->valuestring, "train") ||
                                                     !strcmp(ph->valuestring, "eval") || !strcmp(ph->valuestring, "ckpt")))
                        ? "field 'phase': expected 'train', 'eval' or 'ckpt'"
                    : NULL;
    if (bad) {
        cJSON_Delete(b);
        m_reply_error(rp, 400, "straggler report: %s", bad);
        return;
    }
    if ((int64_t)g->valuedouble != m->gen) {
        m_reply_error(rp, 409, "straggler report of generation %lld; the current one is %lld",
                      (long long)g->valuedouble, (long long)m->gen);
        cJSON_Delete(b);
        return;
    }
    if (!s->mon || s->n != n || s->lo || s->gen != m->gen) reset_world(s, n, 0, m->gen);
    long step = (long)st->valuedouble;
    adt_straggler_phase phase = !ph || !strcmp(ph->valuestring, "train") ? ADT_PHASE_TRAIN
                              : !strcmp(ph->valuestring, "eval")        ? ADT_PHASE_EVAL
                                                                         : ADT_PHASE_CKPT;
    for (int i = 0; i < n; i++) {
        s->compute_s[i] = comp[i];
        s->samples[i] = (int64_t)smp[i];
        s->split[i] = (int64_t)spl[i];
    }
    s->step = step;
    if (cJSON_IsNumber(lo)) add_loss(s, step, lo->valuedouble);
    adt_straggler_action a;
    long remaining = cJSON_IsNumber(rem) ? (long)rem->valuedouble : 0;
    int rc = adt_straggler_observe(s->mon, step, phase, s->compute_s, s->samples, s->split, remaining, &a);
    cJSON_Delete(b);
    if (rc) {
        m_reply_error(rp, 422, "straggler report: %s", adt_error_message());
        return;
    }
    cJSON *o = cJSON_CreateObject();
    cJSON *sa = cJSON_AddArrayToObject(o, "split");
    for (int i = 0; i < n; i++) cJSON_AddItemToArray(sa, cJSON_CreateNumber((double)s->split[i]));
    if (a.kind != ADT_ACTION_NONE) {
        dash_action *d = &s->act[s->n_act++ % ACT_MAX];
        *d = (dash_action){.generation = m->gen, .a = a, .wall = adt_wall_s()};
        if (a.kind == ADT_ACTION_RESTART) d->applied = restart_elsewhere(m, &a);
        else ms_event(m, "straggler", m->gen, -1, a.rank, "%s", a.why);
        cJSON_AddItemToObject(o, "action", action_json(d));
    } else {
        cJSON_AddNullToObject(o, "action");
    }
    m_reply_json(rp, 200, o);
}

static cJSON *straggler_json(adt_master *m) {
    m_strag *s = m->strag;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "policy", adt_straggler_policy_name(s->cfg.policy));
    cJSON *c = cJSON_AddObjectToObject(o, "config");
    cJSON_AddNumberToObject(c, "k", s->cfg.slow_ratio[ADT_PHASE_TRAIN]);
    cJSON_AddNumberToObject(c, "warmup", s->cfg.warmup_steps);
    cJSON_AddNumberToObject(c, "persist", s->cfg.persist_after);
    cJSON_AddNumberToObject(c, "clear", s->cfg.clear_after);
    cJSON_AddNumberToObject(c, "cooldown", s->cfg.cooldown);
    cJSON_AddNumberToObject(c, "gain", s->cfg.min_gain);
    cJSON_AddNumberToObject(c, "restart_cost", s->cfg.restart_cost_s);
    cJSON_AddNumberToObject(o, "generation", (double)s->gen);
    cJSON_AddNumberToObject(o, "step", (double)s->step);
    cJSON *r = cJSON_AddArrayToObject(o, "ranks");
    for (int i = 0; s->mon && i < s->n; i++) {
        char js[512];
        adt_straggler_rank_json(s->mon, i, js, sizeof js);
        cJSON *x = cJSON_Parse(js);
        cJSON_AddNumberToObject(x, "replica", s->lo + i);
        cJSON_AddNumberToObject(x, "local_batch", (double)s->split[i]);
        cJSON_AddNumberToObject(x, "compute_s", s->compute_s[i]);
        cJSON_AddNumberToObject(x, "samples_per_s", s->compute_s[i] > 0 ? (double)s->samples[i] / s->compute_s[i] : 0);
        cJSON_AddItemToArray(r, x);
    }
    cJSON *sv = cJSON_AddArrayToObject(o, "servers");
    for (int i = 0; s->srv_mon && i < s->n_srv; i++) {
        char js[512];
        adt_straggler_rank_json(s->srv_mon, i, js, sizeof js);
        cJSON *x = cJSON_Parse(js);
        cJSON_AddNumberToObject(x, "server", i);
        cJSON_AddNumberToObject(x, "answer_s", s->srv_s[i]);
        cJSON_AddItemToArray(sv, x);
    }
    cJSON *acts = cJSON_AddArrayToObject(o, "actions");
    int64_t first = s->n_act > ACT_MAX ? s->n_act - ACT_MAX : 0;
    for (int64_t i = first; i < s->n_act; i++) cJSON_AddItemToArray(acts, action_json(&s->act[i % ACT_MAX]));
    cJSON_AddNumberToObject(o, "actions_total", (double)s->n_act);
    cJSON *l = cJSON_AddArrayToObject(o, "loss");
    for (int i = 0; i < s->n_loss; i++) {
        cJSON *p = cJSON_CreateArray();
        cJSON_AddItemToArray(p, cJSON_CreateNumber(s->loss_step[i]));
        cJSON_AddItemToArray(p, cJSON_CreateNumber(s->loss_val[i]));
        cJSON_AddItemToArray(l, p);
    }
    return o;
}

/* The page: plain HTML, CSS and JavaScript, no outside resources (the master may run where
 * nothing else can be reached). It polls the JSON endpoints and redraws. */
static const char k_page[] =
    "<!doctype html>\n<html><head><meta charset=\"utf-8\"><title>adtrain job</title>\n"
    "<style>\n"
    "body{font:14px system-ui,sans-serif;margin:16px;background:#fafafa;color:#222}\n"
    "h1{font-size:20px;margin:0 0 8px}h2{font-size:15px;margin:16px 0 6px}\n"
    "table{border-collapse:collapse;background:#fff}td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}\n"
    "th{background:#eee}.normal{background:#dfd}.transient{background:#ffd}.persistent{background:#fcc}\n"
    ".bar{display:inline-block;height:14px;vertical-align:middle}\n"
    "#grid{display:grid;grid-template-columns:1fr 1fr;gap:12px}\n"
    ".box{background:#fff;border:1px solid #ddd;padding:8px}\n"
    "</style></head><body>\n"
    "<h1>adtrain job <span id=\"run\"></span></h1>\n"
    "<div id=\"summary\">loading...</div>\n"
    "<div id=\"grid\">\n"
    "<div class=\"box\"><h2>Workers and speeds</h2><table id=\"workers\"></table></div>\n"
    "<div class=\"box\"><h2>Loss</h2><svg id=\"loss\" width=\"460\" height=\"200\"></svg></div>\n"
    "<div class=\"box\"><h2>Shard progress (this epoch)</h2><div id=\"shards\"></div></div>\n"
    "<div class=\"box\"><h2>Straggler actions</h2><table id=\"actions\"></table></div>\n"
    "</div>\n<p id=\"updated\"></p>\n"
    "<script>\n"
    "const q=new URLSearchParams(location.search);const tok=q.get('token');\n"
    "const hdr=tok?{headers:{Authorization:'Bearer '+tok}}:{};\n"
    "async function get(p){try{const r=await fetch(p,hdr);return r.ok?await r.json():null}catch(e){return null}}\n"
    "function esc(s){return String(s).replace(/[&<>\"]/g,c=>({'&':'&amp;','<':'&lt;','>':'&gt;','\"':'&quot;'}[c]))}\n"
    "function fmt(x,d){return x===undefined||x===null?'-':Number(x).toFixed(d)}\n"
    "function drawLoss(pts){const s=document.getElementById('loss');if(!pts||pts.length<1){s.innerHTML="
    "'<text x=\"10\" y=\"20\">no steps reported yet</text>';return}\n"
    " const W=460,H=200,P=30;let x0=pts[0][0],x1=pts[pts.length-1][0],y0=Infinity,y1=-Infinity;\n"
    " for(const p of pts){y0=Math.min(y0,p[1]);y1=Math.max(y1,p[1])}if(x1==x0)x1=x0+1;if(y1==y0)y1=y0+1;\n"
    " const X=x=>P+(x-x0)/(x1-x0)*(W-P-5),Y=y=>H-P+(-(y-y0)/(y1-y0))*(H-P-5);\n"
    " const d=pts.map((p,i)=>(i?'L':'M')+X(p[0]).toFixed(1)+','+Y(p[1]).toFixed(1)).join('');\n"
    " s.innerHTML='<path d=\"'+d+'\" fill=\"none\" stroke=\"#36c\" stroke-width=\"1.5\"/>'+\n"
    "  '<line x1=\"'+P+'\" y1=\"'+(H-P)+'\" x2=\"'+W+'\" y2=\"'+(H-P)+'\" stroke=\"#888\"/>'+\n"
    "  '<line x1=\"'+P+'\" y1=\"0\" x2=\"'+P+'\" y2=\"'+(H-P)+'\" stroke=\"#888\"/>'+\n"
    "  '<text x=\"'+P+'\" y=\"'+(H-P+14)+'\" font-size=\"11\">step '+x0+'</text>'+\n"
    "  '<text x=\"'+(W-70)+'\" y=\"'+(H-P+14)+'\" font-size=\"11\">step '+x1+'</text>'+\n"
    "  '<text x=\"0\" y=\"12\" font-size=\"11\">'+y1.toFixed(3)+'</text>'+\n"
    "  '<text x=\"0\" y=\"'+(H-P)+'\" font-size=\"11\">'+y0.toFixed(3)+'</text>'}\n"
    "async function refresh(){\n"
    " const [job,workers,st]=await Promise.all([get('/v1/job'),get('/v1/workers'),get('/v1/straggler')]);\n"
    " if(job){document.getElementById('run').textContent=job.run_id;\n"
    "  document.getElementById('summary').innerHTML='job <b>'+esc(job.job_state)+'</b>, generation <b id=\"gen\">'+"
    "job.generation+'</b> ('+esc(job.state)+(job.reason?': '+esc(job.reason):'')+'), world '+job.world_size+"
    "' ranks, '+job.replicas+' replicas of '+job.ranks_per_replica+' (the plan), restarts '+job.restarts+"
    "(job.plan?', plan <b>'+esc(job.plan.strategy)+'</b> on mesh '+esc(job.plan.mesh)+(job.plan.predicted_step_s>0?"
    "' (predicted '+(job.plan.predicted_step_s*1e3).toFixed(3)+' ms/step)':'')+(job.plan.note?' - '+esc(job.plan.note):''):'')+"
    "(st?', straggler policy <b>'+esc(st.policy)+'</b> at step '+st.step:'');\n"
    "  const L=job.ledger,sh=document.getElementById('shards');\n"
    "  if(L){const tot=L.committed_samples+L.uncommitted_samples+L.leased_samples+L.pool_samples||1;\n"
    "   const seg=(v,c,t)=>'<span class=\"bar\" title=\"'+t+'\" style=\"width:'+(400*v/tot).toFixed(1)+'px;background:'+c+'\"></span>';\n"
    "   sh.innerHTML=seg(L.committed_samples,'#3a3','committed')+seg(L.uncommitted_samples,'#9c9','consumed')+"
    "seg(L.leased_samples,'#fc6','leased')+seg(L.pool_samples,'#ddd','to do')+'<br>committed '+L.committed_samples+"
    "', consumed '+L.uncommitted_samples+', leased '+L.leased_samples+', to do '+L.pool_samples+', step '+L.next_step+"
    "' of '+L.total_steps}else sh.textContent='no data ledger (the trainer shards its own data)'}\n"
    " const wt=document.getElementById('workers');let h='<tr><th>rank</th><th>node</th><th>pid</th><th>state</th>"
    "<th>local batch</th><th>samples/s</th><th>ms/sample</th></tr>';\n"
    " const ranks=st?st.ranks:[];const n=Math.max(ranks.length,workers?workers.length:0);\n"
    " for(let i=0;i<n;i++){const w=workers&&workers[i]?workers[i]:{},r=ranks[i]||{};\n"
    "  h+='<tr class=\"'+(r.state||'')+'\"><td>'+i+'</td><td>'+esc(w.node||'-')+'</td><td>'+(w.pid||'-')+'</td><td>'+"
    "esc(r.state||'-')+'</td><td>'+(r.local_batch===undefined?'-':r.local_batch)+'</td><td>'+fmt(r.samples_per_s,1)+'</td><td>'+"
    "fmt(r.per_sample_s===undefined?undefined:r.per_sample_s*1e3,3)+'</td></tr>'}\n"
    " wt.innerHTML=h;\n"
    " const at=document.getElementById('actions');let a='<tr><th>gen</th><th>step</th><th>action</th><th>rank</th>"
    "<th>why</th></tr>';\n"
    " if(st)for(const x of st.actions.slice().reverse())a+='<tr><td>'+x.generation+'</td><td>'+x.step+'</td><td>'+"
    "esc(x.kind)+(x.applied?' (done)':'')+'</td><td>'+x.rank+'</td><td style=\"text-align:left\">'+esc(x.why)+"
    "'</td></tr>';\n"
    " at.innerHTML=a;drawLoss(st?st.loss:null);\n"
    " document.getElementById('updated').textContent='updated '+new Date().toLocaleTimeString()}\n"
    "refresh();setInterval(refresh,1000);\n"
    "</script></body></html>\n";

int m_dash_handle(adt_master *m, const adt_http_request *rq, adt_http_reply *rp) {
    int get = !strcmp(rq->method, "GET") || !strcmp(rq->method, "HEAD"), post = !strcmp(rq->method, "POST");
    if (!strcmp(rq->path, "/dashboard")) {
        if (!get) m_reply_error(rp, 405, "method %.16s not allowed on %.200s", rq->method, rq->path);
        else rp->status = 200, rp->content_type = "text/html; charset=utf-8", rp->body = adt_strdup(k_page),
             rp->len = strlen(rp->body);
        return 1;
    }
    if (!strcmp(rq->path, "/v1/straggler")) {
        if (!get) m_reply_error(rp, 405, "method %.16s not allowed on %.200s", rq->method, rq->path);
        else m_reply_json(rp, 200, straggler_json(m));
        return 1;
    }
    if (!strcmp(rq->path, "/v1/straggler/report")) {
        if (!post) m_reply_error(rp, 405, "method %.16s not allowed on %.200s", rq->method, rq->path);
        else ep_report(m, rq, rp);
        return 1;
    }
    return 0;
}

/* ---------------------------------------------------------------------------------------------
 * The split of an elastic world: the controller on the compute times the replicas send with
 * their step reports. One decision reaches every replica in the replies of the data calls, with
 * the step it applies from: F = the highest step reported + 4 when it is taken (a worker knows
 * step t's split from the reply to its report of step t-3, adtrain/elastic.h). Steps below F
 * run the split before; no step below F is given to the monitor after a change, so no second
 * decision comes before every replica switched.
 */
static int64_t sum64(const int64_t *v, int n) {
    int64_t t = 0;
    for (int i = 0; i < n; i++) t += v[i];
    return t;
}

static void split_text(const int64_t *v, int n, char *buf, size_t cap) {
    size_t o = 0;
    buf[0] = 0;
    for (int i = 0; i < n && o + 24 < cap; i++) o += (size_t)snprintf(buf + o, cap - o, "%s%lld", i ? "," : "", (long long)v[i]);
}

double *m_split_speeds(adt_master *m) {
    if (m->world_size < 1) return NULL;
    double *v = adt_calloc((size_t)m->world_size, sizeof *v);
    int any = 0;
    for (int i = 0; i < m->n_slots; i++) {
        const m_slot *sl = &m->slots[i];
        const m_agent *a = m_agent_find(m, sl->agent);
        for (int l = 0; a && l < sl->local_size && l < a->n_speed; l++)
            if (sl->rank_offset + l < m->world_size && a->speed[l] > 0) v[sl->rank_offset + l] = a->speed[l], any = 1;
    }
    if (!any) free(v), v = NULL;
    return v;
}

/* The device of world rank `rank` ran at `speed` samples/s of compute. */
static void note_speed(adt_master *m, int rank, double speed) {
    for (int i = 0; i < m->n_slots; i++) {
        const m_slot *sl = &m->slots[i];
        if (rank < sl->rank_offset || rank >= sl->rank_offset + sl->local_size) continue;
        m_agent *a = m_agent_find(m, sl->agent);
        if (!a) return;
        int l = rank - sl->rank_offset;
        if (l >= a->n_speed) {
            a->speed = adt_realloc(a->speed, (size_t)(l + 1) * sizeof *a->speed);
            for (int k = a->n_speed; k <= l; k++) a->speed[k] = 0;
            a->n_speed = l + 1;
        }
        a->speed[l] = speed;
        return;
    }
}

static void split_save(adt_master *m) {
    cJSON *o = cJSON_CreateObject();
    wj_split_to_json(o, &m->strag->sp);
    char *txt = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    ms_split_state_save(m, m->gen, txt);
    free(txt);
}

/* The servers' monitor of a new world: lo servers answering nw replicas. */
static void servers_begin(m_strag *s, int nw, int lo) {
    adt_straggler_free(s->srv_mon);
    s->srv_mon = NULL;
    /* one server has no peers to be slower than; a worker reports at most ADT_ELASTIC_MAX_SERVERS */
    s->n_srv = lo >= 2 && lo <= ADT_ELASTIC_MAX_SERVERS ? lo : 0;
    if (!s->n_srv) return;
    adt_straggler_cfg c = s->cfg;
    c.policy = ADT_STRAGGLER_OFF;
    s->srv_mon = adt_straggler_create(lo, &c);
    s->ring_srv = adt_realloc(s->ring_srv, (size_t)RING * (size_t)nw * (size_t)lo * sizeof *s->ring_srv);
    s->srv_s = adt_realloc(s->srv_s, (size_t)lo * sizeof *s->srv_s);
    s->srv_state = adt_realloc(s->srv_state, (size_t)lo * sizeof *s->srv_state);
    for (int i = 0; i < lo; i++) s->srv_s[i] = 0, s->srv_state[i] = ADT_STRAGGLER_NORMAL;
}

/* A server turning persistent (or normal again) is a straggler_server event. */
static void servers_log_states(adt_master *m, int64_t step) {
    m_strag *s = m->strag;
    int S = s->n_srv;
    for (int p = 0; p < S; p++) {
        const adt_straggler_rank *ri = adt_straggler_rank_info(s->srv_mon, p);
        adt_straggler_state now = ri->state;
        if (now == ADT_STRAGGLER_TRANSIENT || now == s->srv_state[p]) continue; /* persistent, or normal again */
        s->srv_state[p] = now;
        double others = 0;
        int no = 0;
        for (int q = 0; q < S; q++)
            if (q != p) others += adt_straggler_rank_info(s->srv_mon, q)->ewma_s, no++;
        ms_event(m, "straggler_server", m->gen, -1, p,
                 now == ADT_STRAGGLER_PERSISTENT
                     ? "step %lld: server %d (replica %d) answers persistently slower than the others: %.1f ms per "
                       "pull (smoothed) against their mean %.1f ms"
                     : "step %lld: server %d (replica %d) answers as fast as the others again: %.1f ms per pull "
                       "(smoothed) against their mean %.1f ms",
                 (long long)step, p, p, ri->ewma_s * 1e3, no ? others / no * 1e3 : 0.0);
    }
}

/* Every replica reported step `step` (slot k): the servers' mean answer times to the monitor; a
 * server turning persistent (or back to normal) is an event. */
static void servers_observe(adt_master *m, int k, int64_t step) {
    m_strag *s = m->strag;
    int n = s->n, S = s->n_srv;
    if (!s->srv_mon) return;
    const double *a = s->ring_srv + (size_t)k * (size_t)n * (size_t)S;
    int64_t one[ADT_ELASTIC_MAX_SERVERS] = {0}, split[ADT_ELASTIC_MAX_SERVERS] = {0};
    for (int p = 0; p < S; p++) {
        double sum = 0;
        for (int r = 0; r < n; r++) {
            if (a[(size_t)r * (size_t)S + (size_t)p] < 0) return; /* a replica without the times */
            sum += a[(size_t)r * (size_t)S + (size_t)p];
        }
        s->srv_s[p] = sum / n, one[p] = 1, split[p] = 1;
    }
    adt_straggler_action act;
    if (adt_straggler_observe(s->srv_mon, (long)step, ADT_PHASE_TRAIN, s->srv_s, one, split, 0, &act)) return;
    servers_log_states(m, step);
    if (s->cfg.policy != ADT_STRAGGLER_ND) return;
    /* ND restarts a persistent server elsewhere by the workers' rule: its answers hold every step */
    int64_t total = m_job_steps(m);
    for (int p = 0; p < S; p++) {
        if (!adt_straggler_restart_pays(s->srv_mon, (long)step, p, one, (long)(total - step - 1), &act)) continue;
        dash_action *d = &s->act[s->n_act++ % ACT_MAX];
        *d = (dash_action){.generation = m->gen, .a = act, .wall = adt_wall_s(), .server = 1};
        snprintf(d->a.why, sizeof d->a.why, "server %d: %.130s", p, act.why); /* its node's event says so too */
        ms_event(m, "straggler_action", m->gen, -1, p, "restart server %d (replica %d) elsewhere at step %lld: %s", p, p,
                 (long long)step, act.why);
        adt_straggler_action wa = d->a;
        wa.rank = p * m->rpr; /* the server's (idle replica's) first rank */
        d->applied = restart_elsewhere(m, &wa);
        return;
    }
}

/* The first split of the current generation: the one committed with the step it resumes from
 * (as many replicas), else the plan's batch_split, else one in proportion to the speeds
 * measured on its devices (even where none was). None without a policy or a plan's split. */
static void split_begin(adt_master *m) {
    m_strag *s = m->strag;
    if (s->sp_gen == m->gen || !m->have_job || m->replicas < 1) return;
    /* the split covers every replica, the idle ones (parameter servers) at 0; the monitor the others */
    int n = m->replicas, lo = m->idle < n ? m->idle : 0, nw = n - lo;
    int64_t B = m->job.global_batch;
    s->sp_gen = m->gen;
    s->sp.n = 0;
    s->sp_observed = -1;
    for (int i = 0; i < RING; i++) s->ring_step[i] = -1, s->ring_count[i] = 0;
    if (m->cfg.plan_world) m_plan_text(m); /* a restarted master reads the plan file back */
    int planned = !lo && m->plan_gen == m->gen && m->plan.n_split == n && sum64(m->plan.batch_split, n) == B;
    if ((s->cfg.policy == ADT_STRAGGLER_OFF && !planned) || n > WJ_SPLIT_MAX || n > ADT_STRAGGLER_MAX_RANKS || B < nw)
        return;
    int64_t *v = s->sp.cur;
    const char *from = "committed with step";
    char *saved = ms_split_state_load(m, m->gen); /* a restarted master: the one in force */
    cJSON *so = saved ? cJSON_Parse(saved) : NULL;
    free(saved);
    wj_split prev;
    int resumed = so && wj_split_from_json(so, &prev) == 1 && prev.n == n && sum64(prev.cur, n) == B;
    cJSON_Delete(so);
    if (resumed) {
        s->sp = prev;
        s->sp_observed = prev.from - 1;
        from = "resumed";
    } else if (!(m->gen_first_step > 0 && ms_split_load(m, m->gen_first_step, v, n) == n && sum64(v, n) == B)) {
        if (planned) {
            memcpy(v, m->plan.batch_split, (size_t)n * sizeof *v);
            from = "the plan's batch_split";
        } else {
            double *rank_speed = m_split_speeds(m), speed[ADT_STRAGGLER_MAX_RANKS], known = 0;
            int n_known = 0;
            for (int r = 0; r < nw; r++) {
                speed[r] = rank_speed ? rank_speed[(lo + r) * m->rpr] : 0;
                if (speed[r] > 0) known += speed[r], n_known++;
            }
            for (int r = 0; r < nw; r++)
                if (speed[r] <= 0) speed[r] = n_known ? known / n_known : 1;
            from = n_known ? "measured speeds" : "even";
            free(rank_speed);
            int64_t least = s->cfg.min_local > 0 ? s->cfg.min_local : 1;
            for (int r = 0; r < lo; r++) v[r] = 0;
            if (adt_straggler_split(B, nw, speed, (int64_t)nw * least <= B ? least : 1, v + lo)) return;
        }
    }
    if (!resumed) {
        memcpy(s->sp.before, v, (size_t)n * sizeof *v);
        s->sp.from = m->gen_first_step;
        s->sp.n = n;
        split_save(m);
    }
    s->ring_c = adt_realloc(s->ring_c, (size_t)RING * (size_t)nw * sizeof *s->ring_c);
    s->ring_n = adt_realloc(s->ring_n, (size_t)RING * (size_t)nw * sizeof *s->ring_n);
    s->ring_got = adt_realloc(s->ring_got, (size_t)RING * (size_t)nw);
    reset_world(s, nw, lo, m->gen);
    memcpy(s->split, s->sp.cur + lo, (size_t)nw * sizeof *v);
    servers_begin(s, nw, lo);
    char txt[512];
    split_text(v, n, txt, sizeof txt);
    ms_event(m, "split", m->gen, -1, -1, "[%s] from step %lld (%s)", txt, (long long)s->sp.from, from);
}

void m_split_reply(adt_master *m, cJSON *o) {
    split_begin(m);
    if (m->strag->sp_gen == m->gen) wj_split_to_json(o, &m->strag->sp);
}

int m_split_commit(adt_master *m, int64_t steps) {
    split_begin(m);
    m_strag *s = m->strag;
    if (s->sp_gen != m->gen || s->sp.n < 1) return ADT_OK;
    int64_t v[WJ_SPLIT_MAX];
    for (int r = 0; r < s->sp.n; r++) v[r] = wj_split_at(&s->sp, r, steps);
    return ms_split_save(m, steps, v, s->sp.n);
}

/* Every replica reported step `step` (its slot k of the ring): the monitor and controller. */
static void split_observe(adt_master *m, int k, int64_t step) {
    m_strag *s = m->strag;
    int n = s->n, lo = s->lo; /* the monitor's ranks: replicas lo .. lo + n - 1 */
    const double *c = s->ring_c + (size_t)k * (size_t)n;
    const int64_t *smp = s->ring_n + (size_t)k * (size_t)n;
    int64_t split[WJ_SPLIT_MAX];
    memcpy(split, s->sp.cur + lo, (size_t)n * sizeof *split);
    for (int r = 0; r < n; r++) s->compute_s[r] = c[r], s->samples[r] = smp[r], s->split[r] = split[r];
    s->step = (long)step;
    int64_t total = m_job_steps(m);
    adt_straggler_action a;
    if (adt_straggler_observe(s->mon, (long)step, ADT_PHASE_TRAIN, c, smp, split, (long)(total - step - 1), &a)) {
        ms_event(m, "straggler", m->gen, -1, -1, "step %lld: the monitor refused the reports: %s", (long long)step,
                 adt_error_message());
        return;
    }
    s->sp_observed = step;
    for (int r = 0; r < n; r++) {
        const adt_straggler_rank *ri = adt_straggler_rank_info(s->mon, r);
        if (ri && ri->ewma_s > 0)
            for (int q = 0; q < m->rpr; q++) note_speed(m, (lo + r) * m->rpr + q, 1.0 / ri->ewma_s);
    }
    if (a.kind == ADT_ACTION_NONE) return;
    dash_action *d = &s->act[s->n_act++ % ACT_MAX];
    *d = (dash_action){.generation = m->gen, .a = a, .wall = adt_wall_s()};
    d->a.rank += lo; /* the replica (its `why` counts the monitor's ranks) */
    char txt[512];
    if (a.kind == ADT_ACTION_REBALANCE && memcmp(split, s->sp.cur + lo, (size_t)n * sizeof *split)) {
        memcpy(s->sp.before, s->sp.cur, (size_t)s->sp.n * sizeof *split);
        memcpy(s->sp.cur + lo, split, (size_t)n * sizeof *split);
        s->sp.from = (m->max_reported > step ? m->max_reported : step) + 4;
        d->applied = 1;
        split_save(m);
        split_text(s->sp.cur, s->sp.n, txt, sizeof txt);
        ms_event(m, "straggler_action", m->gen, -1, lo + a.rank, "rebalance: split [%s] from step %lld (decided at step %lld): %s",
                 txt, (long long)s->sp.from, (long long)step, a.why);
    } else if (a.kind == ADT_ACTION_RESTART) {
        adt_straggler_action wa = a;
        wa.rank = (lo + a.rank) * m->rpr; /* the replica's first rank */
        split_text(s->sp.cur, s->sp.n, txt, sizeof txt);
        ms_event(m, "straggler_action", m->gen, -1, lo + a.rank, "restart elsewhere at step %lld (split [%s]): %s",
                 (long long)step, txt, a.why);
        d->applied = restart_elsewhere(m, &wa);
    }
}

void m_split_step(adt_master *m, int replica, int64_t step, double compute_s, int64_t samples, const double *server_s,
                  int n_srv) {
    split_begin(m);
    m_strag *s = m->strag;
    if (s->cfg.policy == ADT_STRAGGLER_OFF || s->sp_gen != m->gen || s->sp.n < 1) return;
    if (compute_s < 0) {
        if (s->idle_gen != m->gen) { /* the policy was asked for: say once why it cannot act */
            s->idle_gen = m->gen;
            ms_event(m, "straggler_idle", m->gen, -1, replica,
                     "straggler policy %s: replica %d reports step %lld without compute_s; the policy cannot act on "
                     "this world's speeds",
                     adt_straggler_policy_name(s->cfg.policy), replica, (long long)step);
        }
        return;
    }
    if (replica < s->lo || replica >= s->sp.n || step < s->sp.from || step <= s->sp_observed) return;
    replica -= s->lo; /* the monitor's rank */
    int k = (int)(step % RING), n = s->n;
    if (s->ring_step[k] != step) {
        s->ring_step[k] = step, s->ring_count[k] = 0;
        memset(s->ring_got + (size_t)k * (size_t)n, 0, (size_t)n);
    }
    unsigned char *got = s->ring_got + (size_t)k * (size_t)n;
    if (got[replica]) return; /* a retried report */
    got[replica] = 1;
    for (int p = 0; p < s->n_srv; p++)
        s->ring_srv[((size_t)k * (size_t)n + (size_t)replica) * (size_t)s->n_srv + (size_t)p] =
            n_srv == s->n_srv ? server_s[p] : -1;
    s->ring_c[(size_t)k * (size_t)n + (size_t)replica] = compute_s;
    s->ring_n[(size_t)k * (size_t)n + (size_t)replica] = samples;
    if (++s->ring_count[k] < n) return;
    s->ring_step[k] = -1;
    servers_observe(m, k, step);
    split_observe(m, k, step);
}
