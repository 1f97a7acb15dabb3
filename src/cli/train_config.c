/*
 * train_config.c — config.json of `bitexact train` (train_config.h): the
 * fields of transformers' Glm4MoeConfig under their names, read with
 * Glm4MoeConfig's defaults for absent fields, range-checked, and written
 * back as transformers writes them.
 *
 * RoPE: GLM-4.5's config.json files (transformers 4.x) put rope_theta and
 * partial_rotary_factor at the top level, with "rope_scaling": null;
 * transformers 5 writes "rope_parameters": {"rope_type": "default",
 * "rope_theta": ..., "partial_rotary_factor": ...}. Both are read (when
 * both are present they must agree) and both are written. Only the
 * default RoPE is supported: any rope_scaling other than null or
 * {"rope_type": "default"} is refused.
 *
 * head_dim absent: hidden_size / num_attention_heads (Glm4MoeAttention's
 * getattr default). Keys this trainer does not use (bos/eos/pad ids,
 * use_cache, torch_dtype, num_nextn_predict_layers, ...) are ignored;
 * keys that would change the model in a way not implemented
 * (attention_dropout != 0, a rope_scaling) are refused.
 */
#include "errbuf.h"
#include "train_config.h"

#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>


/* ---- reading ------------------------------------------------------------ */

static int get_int(json_t *root, const char *key, int64_t *out, char *err, size_t errlen) {
  json_t *v = json_object_get(root, key);
  if (!v || json_is_null(v)) return 0;
  if (json_is_real(v)) {
    double d = json_real_value(v);
    if (d == floor(d) && fabs(d) < 9.0e15) return *out = (int64_t)d, 0;
  }
  if (!json_is_integer(v)) return cli_errf(err, errlen, "%s: expected an integer", key);
  *out = json_integer_value(v);
  return 0;
}

static int get_real(json_t *root, const char *key, double *out, char *err, size_t errlen) {
  json_t *v = json_object_get(root, key);
  if (!v || json_is_null(v)) return 0;
  if (!json_is_number(v)) return cli_errf(err, errlen, "%s: expected a number", key);
  *out = json_number_value(v);
  return 0;
}

static int get_bool(json_t *root, const char *key, int *out, char *err, size_t errlen) {
  json_t *v = json_object_get(root, key);
  if (!v || json_is_null(v)) return 0;
  if (!json_is_boolean(v)) return cli_errf(err, errlen, "%s: expected true or false", key);
  *out = json_is_true(v);
  return 0;
}

/* A number at top level and/or in rope_parameters; both present: equal. */
static int get_rope(json_t *root, json_t *rp, const char *key, double *out, char *err,
                    size_t errlen) {
  int top = json_object_get(root, key) && !json_is_null(json_object_get(root, key));
  double a = *out, b = *out;
  if (get_real(root, key, &a, err, errlen)) return -1;
  if (rp && json_object_get(rp, key) && !json_is_null(json_object_get(rp, key))) {
    json_t *v = json_object_get(rp, key);
    if (!json_is_number(v)) return cli_errf(err, errlen, "rope_parameters.%s: expected a number", key);
    b = json_number_value(v);
    if (top && a != b)
      return cli_errf(err, errlen, "%s: %.17g at top level but %.17g in rope_parameters", key, a, b);
    *out = b;
    return 0;
  }
  *out = a;
  return 0;
}

static int check_rope_type(json_t *obj, const char *what, char *err, size_t errlen) {
  json_t *t = json_object_get(obj, "rope_type");
  if (!t) t = json_object_get(obj, "type");
  if (t && !json_is_null(t) && !(json_is_string(t) && strcmp(json_string_value(t), "default") == 0))
    return cli_errf(err, errlen, "%s: only the default RoPE is supported (rope_type \"default\")", what);
  if (!t && strcmp(what, "rope_scaling") == 0)
    return cli_errf(err, errlen, "rope_scaling: only null or {\"rope_type\": \"default\"} is supported");
  return 0;
}

static int parse_root(json_t *root, tr_config *c, char *err, size_t errlen) {
  if (!json_is_object(root)) return cli_errf(err, errlen, "config.json is not a JSON object");
  json_t *mt = json_object_get(root, "model_type");
  if (mt && !(json_is_string(mt) && strcmp(json_string_value(mt), "glm4_moe") == 0)) {
    if (!json_is_string(mt))
      return cli_errf(err, errlen, "model_type: expected \"glm4_moe\" (the GLM-4.5 MoE model)");
    return cli_errf(err, errlen, "model_type \"%.64s\" is not supported (only \"glm4_moe\", the "
                    "GLM-4.5 MoE model)", json_string_value(mt));
  }
  /* PaddleFormers' Glm4MoeConfig states the router's rule: only GLM-4.5's */
  static const struct {
    const char *key, *value;
  } fixed[] = {{"scoring_func", "sigmoid"}, {"topk_method", "noaux_tc"}};
  for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++) {
    json_t *v = json_object_get(root, fixed[i].key);
    if (v && !json_is_null(v) && !(json_is_string(v) && strcmp(json_string_value(v), fixed[i].value) == 0))
      return cli_errf(err, errlen, "%s: only \"%s\" is supported (GLM-4.5's router)", fixed[i].key,
                      fixed[i].value);
  }
  static const struct {
    const char *key;
    size_t off;
  } ints[] = {
      {"vocab_size", offsetof(tr_config, vocab_size)},
      {"hidden_size", offsetof(tr_config, hidden_size)},
      {"intermediate_size", offsetof(tr_config, intermediate_size)},
      {"moe_intermediate_size", offsetof(tr_config, moe_intermediate_size)},
      {"num_hidden_layers", offsetof(tr_config, num_hidden_layers)},
      {"num_attention_heads", offsetof(tr_config, num_attention_heads)},
      {"num_key_value_heads", offsetof(tr_config, num_key_value_heads)},
      {"head_dim", offsetof(tr_config, head_dim)},
      {"max_position_embeddings", offsetof(tr_config, max_position_embeddings)},
      {"first_k_dense_replace", offsetof(tr_config, first_k_dense_replace)},
      {"n_routed_experts", offsetof(tr_config, n_routed_experts)},
      {"num_experts_per_tok", offsetof(tr_config, num_experts_per_tok)},
      {"n_shared_experts", offsetof(tr_config, n_shared_experts)},
      {"n_group", offsetof(tr_config, n_group)},
      {"topk_group", offsetof(tr_config, topk_group)},
  };
  for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++)
    if (get_int(root, ints[i].key, (int64_t *)((char *)c + ints[i].off), err, errlen)) return -1;
  if (get_bool(root, "attention_bias", &c->attention_bias, err, errlen) ||
      get_bool(root, "use_qk_norm", &c->use_qk_norm, err, errlen) ||
      get_bool(root, "norm_topk_prob", &c->norm_topk_prob, err, errlen) ||
      get_bool(root, "tie_word_embeddings", &c->tie_word_embeddings, err, errlen) ||
      get_real(root, "rms_norm_eps", &c->rms_norm_eps, err, errlen) ||
      get_real(root, "routed_scaling_factor", &c->routed_scaling_factor, err, errlen) ||
      get_real(root, "initializer_range", &c->initializer_range, err, errlen))
    return -1;
  json_t *act = json_object_get(root, "hidden_act");
  if (act && !json_is_null(act)) {
    if (!json_is_string(act)) return cli_errf(err, errlen, "hidden_act: expected a string");
    const char *s = json_string_value(act);
    if (strcmp(s, "silu") != 0) {
      char b[40];
      snprintf(b, sizeof b, "%.32s", s);
      return cli_errf(err, errlen, "hidden_act: \"%s\" is not supported (only \"silu\")", b);
    }
  }
  double drop = 0;
  if (get_real(root, "attention_dropout", &drop, err, errlen)) return -1;
  if (drop != 0)
    return cli_errf(err, errlen, "attention_dropout: %g is not supported (only 0)", drop);
  json_t *rs = json_object_get(root, "rope_scaling");
  if (rs && !json_is_null(rs)) {
    if (!json_is_object(rs)) return cli_errf(err, errlen, "rope_scaling: expected null or an object");
    if (check_rope_type(rs, "rope_scaling", err, errlen)) return -1;
  }
  json_t *rp = json_object_get(root, "rope_parameters");
  if (rp && json_is_null(rp)) rp = NULL;
  if (rp) {
    if (!json_is_object(rp)) return cli_errf(err, errlen, "rope_parameters: expected an object");
    if (check_rope_type(rp, "rope_parameters", err, errlen)) return -1;
  }
  if (get_rope(root, rp, "rope_theta", &c->rope_theta, err, errlen) ||
      get_rope(root, rp, "partial_rotary_factor", &c->partial_rotary_factor, err, errlen))
    return -1;
  if (c->head_dim == 0 && c->num_attention_heads > 0)
    c->head_dim = c->hidden_size / c->num_attention_heads;
  return 0;
}

int tr_config_load(const char *path, tr_config *c, char *err, size_t errlen) {
  json_error_t je;
  json_t *root = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
  if (!root) {
    if (strncmp(je.text, "unable to open", 14) == 0) return cli_errf(err, errlen, "%s", je.text);
    return cli_errf(err, errlen, "invalid JSON: %s (line %d, column %d)", je.text, je.line, je.column);
  }
  tr_config t;
  tr_config_defaults(&t);
  int rc = parse_root(root, &t, err, errlen);
  json_decref(root);
  if (rc == 0) rc = tr_config_check(&t, err, errlen);
  if (rc == 0) *c = t;
  return rc;
}

int tr_config_parse(const char *text, size_t len, tr_config *c, char *err, size_t errlen) {
  json_error_t je;
  json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
  if (!root)
    return cli_errf(err, errlen, "invalid JSON: %s (line %d, column %d)", je.text, je.line, je.column);
  tr_config t;
  tr_config_defaults(&t);
  int rc = parse_root(root, &t, err, errlen);
  json_decref(root);
  if (rc == 0) rc = tr_config_check(&t, err, errlen);
  if (rc == 0) *c = t;
  return rc;
}

/* ---- writing ------------------------------------------------------------ */

/* The shortest "%.*g" that reads back as d (always with a '.' or an
 * exponent, as Python's json writes floats). */
static void real_text(double d, char *buf, size_t len) {
  for (int p = 1; p <= 17; p++) {
    snprintf(buf, len, "%.*g", p, d);
    if (strtod(buf, NULL) == d) break;
  }
  if (!strpbrk(buf, ".eEn")) strncat(buf, ".0", len - strlen(buf) - 1);
}

static int write_value(FILE *fp, json_t *v, int indent) {
  if (json_is_real(v)) {
    char b[40];
    real_text(json_real_value(v), b, sizeof b);
    return fputs(b, fp) < 0 ? -1 : 0;
  }
  if (json_is_object(v)) {
    const char *keys[64];
    size_t n = 0;
    const char *k;
    json_t *x;
    json_object_foreach(v, k, x) if (n < 64) keys[n++] = k;
    for (size_t i = 1; i < n; i++) /* insertion sort: bytewise key order */
      for (size_t j = i; j > 0 && strcmp(keys[j - 1], keys[j]) > 0; j--) {
        const char *t = keys[j];
        keys[j] = keys[j - 1];
        keys[j - 1] = t;
      }
    fputs("{\n", fp);
    for (size_t i = 0; i < n; i++) {
      fprintf(fp, "%*s\"%s\": ", indent + 2, "", keys[i]);
      if (write_value(fp, json_object_get(v, keys[i]), indent + 2)) return -1;
      fputs(i + 1 < n ? ",\n" : "\n", fp);
    }
    fprintf(fp, "%*s}", indent, "");
    return 0;
  }
  char *s = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT);
  if (!s) return -1;
  int rc = fputs(s, fp) < 0 ? -1 : 0;
  free(s);
  return rc;
}

/* r as indented JSON with sorted keys and shortest round-trip reals. */
static int write_sorted(json_t *r, const char *path) {
  FILE *fp = fopen(path, "wb");
  if (!fp) return -1;
  int rc = write_value(fp, r, 0);
  if (fputc('\n', fp) == EOF) rc = -1;
  if (fclose(fp) != 0) rc = -1;
  return rc;
}

int tr_config_save(const tr_config *c, const char *path, char *err, size_t errlen) {
  json_t *r = json_object();
  json_t *rp = json_object();
  if (!r || !rp) {
    json_decref(r);
    json_decref(rp);
    return cli_errf(err, errlen, "out of memory");
  }
  json_object_set_new(r, "architectures", json_pack("[s]", "Glm4MoeForCausalLM"));
  json_object_set_new(r, "model_type", json_string("glm4_moe"));
  json_object_set_new(r, "torch_dtype", json_string("float32"));
  json_object_set_new(r, "vocab_size", json_integer(c->vocab_size));
  json_object_set_new(r, "hidden_size", json_integer(c->hidden_size));
  json_object_set_new(r, "intermediate_size", json_integer(c->intermediate_size));
  json_object_set_new(r, "moe_intermediate_size", json_integer(c->moe_intermediate_size));
  json_object_set_new(r, "num_hidden_layers", json_integer(c->num_hidden_layers));
  json_object_set_new(r, "num_attention_heads", json_integer(c->num_attention_heads));
  json_object_set_new(r, "num_key_value_heads", json_integer(c->num_key_value_heads));
  json_object_set_new(r, "head_dim", json_integer(c->head_dim));
  json_object_set_new(r, "max_position_embeddings", json_integer(c->max_position_embeddings));
  json_object_set_new(r, "attention_bias", json_boolean(c->attention_bias));
  json_object_set_new(r, "attention_dropout", json_real(0.0));
  json_object_set_new(r, "use_qk_norm", json_boolean(c->use_qk_norm));
  json_object_set_new(r, "partial_rotary_factor", json_real(c->partial_rotary_factor));
  json_object_set_new(r, "rope_theta", json_real(c->rope_theta));
  json_object_set_new(r, "rope_scaling", json_null());
  json_object_set_new(rp, "rope_type", json_string("default"));
  json_object_set_new(rp, "rope_theta", json_real(c->rope_theta));
  json_object_set_new(rp, "partial_rotary_factor", json_real(c->partial_rotary_factor));
  json_object_set_new(r, "rope_parameters", rp);
  json_object_set_new(r, "rms_norm_eps", json_real(c->rms_norm_eps));
  json_object_set_new(r, "first_k_dense_replace", json_integer(c->first_k_dense_replace));
  json_object_set_new(r, "n_routed_experts", json_integer(c->n_routed_experts));
  json_object_set_new(r, "num_experts_per_tok", json_integer(c->num_experts_per_tok));
  json_object_set_new(r, "n_shared_experts", json_integer(c->n_shared_experts));
  json_object_set_new(r, "n_group", json_integer(c->n_group));
  json_object_set_new(r, "topk_group", json_integer(c->topk_group));
  json_object_set_new(r, "norm_topk_prob", json_boolean(c->norm_topk_prob));
  json_object_set_new(r, "routed_scaling_factor", json_real(c->routed_scaling_factor));
  json_object_set_new(r, "initializer_range", json_real(c->initializer_range));
  json_object_set_new(r, "tie_word_embeddings", json_boolean(c->tie_word_embeddings));
  json_object_set_new(r, "hidden_act", json_string(c->hidden_act));
  json_object_set_new(r, "use_cache", json_true());
  int rc = write_sorted(r, path);
  json_decref(r);
  if (rc != 0) return cli_errf(err, errlen, "%s: cannot write", path);
  return 0;
}
